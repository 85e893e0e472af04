"""How a run ends when something else ends it: a load process that dies is a failed run (exit
1, the group and the signal named), not a complete run with a group that silently measured
nothing; a hang-up (SIGHUP, the terminal closed) stops the run like Ctrl-C and leaves no
process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from tests.conftest import REPO, ZEROWINDOW, run_cli

SCENARIO = """
name = "load-death"
max_duration_s = 60
cooldown_s = 0.5

[target]
kind = "sim"

[[groups]]
name = "steady"
users = 2
requests_per_user = 3
prompt_tokens = 16
max_tokens = 64

[[groups]]
name = "doomed"
users = 2
requests_per_user = 1
prompt_tokens = 16
max_tokens = 64
action = { kind = "stall", after_tokens = 4, stall_s = 30 }
"""


def _locust_of(run_root: str, group: str = "doomed") -> psutil.Process | None:
    """The Locust process whose command line names ``group``'s configuration under
    ``run_root``."""
    for proc in psutil.process_iter(["cmdline"]):
        text = " ".join(proc.info["cmdline"] or [])
        if run_root in text and f"group-{group}.json" in text and proc.pid != os.getpid():
            return proc
    return None


def _start(
    tmp_path: Path, text: str = SCENARIO
) -> tuple[subprocess.Popen[str], Path, psutil.Process]:
    """``zerowindow run`` of ``text``, once group doomed's Locust process streams."""
    scenario = tmp_path / "load-death.toml"
    scenario.write_text(text)
    out = tmp_path / "runs"
    run = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out), "--no-progress"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    victim = None
    while victim is None and time.monotonic() < deadline and run.poll() is None:
        victim = _locust_of(str(out / "load-death"))
        time.sleep(0.2)
    if victim is None:
        run.kill()
        raise AssertionError(f"the Locust process never appeared: {run.communicate()[0]}")
    time.sleep(2)  # its users are streaming, then stalled
    return run, out, victim


def _signal_and_end(
    run: subprocess.Popen[str], out: Path, process: psutil.Process, sig: int
) -> tuple[str, dict[str, Any]]:
    """Send ``sig`` to ``process``, wait for the run to end; its output and run.json."""
    try:
        process.send_signal(sig)
        output, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    (run_dir,) = out.glob("load-death/*")
    return output, json.loads((run_dir / "run.json").read_text())


def test_a_killed_load_process_fails_the_run(tmp_path: Path):
    run, out, victim = _start(tmp_path)
    output, info = _signal_and_end(run, out, victim, signal.SIGKILL)
    assert run.returncode == 1, output
    assert info["status"] == "failed"
    assert "load process of group doomed was killed by SIGKILL" in info["failure"]
    assert "(see locust-doomed.log)" in info["failure"]


def test_a_hang_up_stops_the_run_and_everything_it_started(tmp_path: Path):
    run, out, _ = _start(tmp_path)
    harness = psutil.Process(run.pid)
    children = harness.children(recursive=True)
    output, info = _signal_and_end(run, out, harness, signal.SIGHUP)
    assert run.returncode == 130, output
    assert info["status"] == "interrupted" and "SIGHUP" in info["failure"]
    assert children and not _still_running(children, within_s=5.0)


COMPARISON = """
[[proxies]]
name = "nginx"
kind = "nginx"

[[proxies]]
name = "none"
kind = "none"
"""


def test_a_killed_harness_leaves_no_process_and_a_folder_analyze_ends(tmp_path: Path):
    """SIGKILL of ``zerowindow run`` mid-load (a CI time limit, the OOM killer) in a comparison
    of proxies: its reaper ends the emulator, the proxy and the Locust processes within 5 s,
    and ``analyze`` ends the configuration's folder as ``killed`` with the requests recorded
    before the kill, and the comparison's as killed before any run ended."""
    run, out, _ = _start(tmp_path, SCENARIO + COMPARISON)
    children = psutil.Process(run.pid).children(recursive=True)
    assert any("nginx" in " ".join(_cmdline(c.pid).split()[:1]) for c in children), children
    run.kill()
    run.communicate(timeout=30)
    left = _still_running(children, within_s=5.0)
    assert not left, [_cmdline(c.pid) for c in left]
    (parent,) = out.glob("load-death/*")
    run_dir = parent / "nginx"
    done = run_cli("analyze", str(run_dir))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "killed" and "killed" in info["failure"], info.get("failure")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"
    # The comparison's folder says so too: no run of it ended, the one in progress is named.
    done = run_cli("analyze", str(parent))
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    plan = json.loads((parent / "plan.json").read_text())
    assert plan["status"] == "failed" and plan["exit_code"] == 1
    assert "killed" in plan["failure"] and "unfinished: nginx" in plan["failure"], plan["failure"]


def _still_running(processes: list[psutil.Process], *, within_s: float) -> list[psutil.Process]:
    """Those of ``processes`` still running (zombies aside) after up to ``within_s`` s."""
    deadline = time.monotonic() + within_s
    while True:
        left = []
        for p in processes:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p)
            except psutil.NoSuchProcess:
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_ctrl_c_while_the_command_starts_is_exit_130_without_a_traceback(tmp_path: Path):
    """SIGINT 0.1 s after start lands while Python imports the CLI here (about 0.9 s); on a
    machine quick enough to be past the imports the run's own handler answers the same."""
    scenario = tmp_path / "s.toml"
    scenario.write_text(SCENARIO)
    argv = [*ZEROWINDOW, "run", str(scenario), "--out", str(tmp_path)]
    # As from a terminal: SIGINT at its default. (A test session started in the background by
    # a non-interactive shell inherits SIGINT ignored, and Python then keeps it ignored.)
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    # A signal between fork and exec meets the parent's handlers and is lost with them: wait
    # until the child runs Python (on a loaded machine that took longer than 0.1 s).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "harness" not in _cmdline(proc.pid):
        time.sleep(0.005)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""
