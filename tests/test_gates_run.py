"""Gates end to end on the engine emulator: `zerowindow run` exits 1 on a failed gate and names
it in junit.xml, 0 when every gate passes, 2 for a missing baseline; baselines are saved and
used by relative gates; the GitHub step summary is appended; progress lines are printed."""

from __future__ import annotations

import dataclasses
import json
import os
import pty
import signal
import subprocess
import time
import xml.etree.ElementTree as ET
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from harness.history import HistoryStore, folder_entries
from tests.conftest import REPO, ZEROWINDOW, only_run_dir, run_cli

TINY = """\
name = "{name}"
max_duration_s = {max_duration_s}
cooldown_s = 0.5
gates = [
{gates}
]

[target]
kind = "sim"

[target.engine]
step_fixed_ms = 2.0

[[groups]]
name = "fast"
users = 2
requests_per_user = {requests}
max_tokens = 32
"""


def write_scenario(
    path: Path,
    gates: list[str],
    *,
    name: str = "gated",
    requests: int = 2,
    max_duration_s: float = 30,
) -> Path:
    body = "\n".join(f"    {json.dumps(g)}," for g in gates)
    path.write_text(
        TINY.format(name=name, gates=body, requests=requests, max_duration_s=max_duration_s)
    )
    return path


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def _junit_cases(run_dir: Path) -> dict[str, ET.Element]:
    root = ET.parse(run_dir / "junit.xml").getroot()
    return {c.get("name", ""): c for c in root.iter("testcase")}


@pytest.fixture(scope="module")
def failing_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One real run with a gate that passes and one that must fail, under a fake GitHub job."""
    tmp = tmp_path_factory.mktemp("gates")
    scenario = write_scenario(
        tmp / "gated.toml", ["fast.outcome.complete == 4", "fast.ttft_p50_ms < 0.001"]
    )
    step = tmp / "step-summary.md"
    step.write_text("## earlier step\n")
    proc = run_cli(
        "run", str(scenario), "--out", str(tmp / "out"),
        env=_env(GITHUB_STEP_SUMMARY=str(step)),
    )  # fmt: skip
    return {"proc": proc, "run_dir": only_run_dir(tmp / "out"), "step": step, "tmp": tmp}


def test_a_failing_gate_exits_1_and_junit_names_it_with_its_value(failing_run):
    proc, run_dir = failing_run["proc"], failing_run["run_dir"]
    assert proc.returncode == 1, proc.stdout + proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete"
    ttft_p50 = summary["groups"][0]["ttft_p50_ms"]
    cases = _junit_cases(run_dir)
    assert list(cases) == ["fast.outcome.complete == 4", "fast.ttft_p50_ms < 0.001"]
    assert cases["fast.outcome.complete == 4"].find("failure") is None
    failure = cases["fast.ttft_p50_ms < 0.001"].find("failure")
    assert failure is not None
    message = failure.get("message", "")
    assert message.startswith("fast.ttft_p50_ms < 0.001: measured ")
    measured = message.split("measured ")[1].split(",")[0]  # "25.1 [6.6, 27.0]": its interval
    assert float(measured.split(" [")[0]) == pytest.approx(ttft_p50, rel=1e-5)
    assert " [" in measured
    assert message.endswith("bound < 0.001")
    info = json.loads((run_dir / "run.json").read_text())
    assert info["exit_code"] == 1
    assert info["gates"] == {"passed": 1, "failed": 1, "skipped": 0, "baseline": None}
    gates = json.loads((run_dir / "gates.json").read_text())["gates"]
    assert [g["passed"] for g in gates] == [True, False]
    assert "FAIL" in proc.stdout and "1 of 2 gates passed (exit 1)" in proc.stdout


def test_github_step_summary_is_appended(failing_run):
    text = failing_run["step"].read_text()
    assert text.startswith("## earlier step\n### ❌ zerowindow `gated`: 1 of 2 gates failed")
    assert "| ❌ | `fast.ttft_p50_ms < 0.001` |" in text
    assert "| ✅ | `fast.outcome.complete == 4` | 4.00 | == 4 |" in text
    assert "| fast | 4 | complete 4 |" in text
    assert str(failing_run["run_dir"]) in text


def test_progress_lines_when_stdout_is_not_a_terminal(failing_run):
    lines = [ln for ln in failing_run["proc"].stdout.splitlines() if "requests finished" in ln]
    phases = [ln.split("gated: ")[1].split(";")[0].split(",")[0] for ln in lines]
    assert phases[0] == "starting target" and phases[-1] == "done"
    assert "load" in phases and "cooldown" in phases
    assert "at most" in next(ln for ln in lines if "gated: load" in ln)
    assert "4 requests finished: fast 4 (TTFT p50 " in lines[-1]


def test_baseline_save_and_a_passing_relative_gate_exits_0(failing_run):
    tmp = failing_run["tmp"]
    baseline = tmp / "baselines" / "gated.json"
    saved = run_cli("baseline", "save", str(failing_run["run_dir"]), "--to", str(baseline))
    assert saved.returncode == 0, saved.stderr
    data = json.loads(baseline.read_text())
    assert data["scenario"] == "gated" and data["figures"]["fast.requests"] == 4
    assert data["provenance"]["run_dir"] == str(failing_run["run_dir"].resolve())
    assert data["provenance"]["versions"]["zerowindow"]

    scenario = write_scenario(
        tmp / "relative.toml",
        [
            "fast.requests == baseline",
            "fast.outcome.complete >= baseline - 1",
            "fast.ttft_p99_ms <= 50 * baseline + 2000",
            "kv_held_after_finish_s <= 1",
        ],
    )
    out = tmp / "out-relative"
    proc = run_cli(
        "run", str(scenario), "--out", str(out), "--baseline", str(baseline), "--no-progress"
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(out)
    root = ET.parse(run_dir / "junit.xml").getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("4", "0", "0")
    gates = json.loads((run_dir / "gates.json").read_text())
    assert gates["baseline"] == str(baseline)
    assert gates["gates"][0]["baseline"] == 4 and gates["gates"][0]["bound"] == 4
    assert "requests finished" not in proc.stdout  # --no-progress


def test_a_baseline_without_the_figure_fails_that_gate(failing_run):
    """A relative gate on a figure the baseline lacks fails with the reason (here: a baseline
    saved from another scenario whose group has another name)."""
    tmp = failing_run["tmp"]
    baseline = tmp / "other.json"
    baseline.write_text(json.dumps({"scenario": "other", "figures": {"slow.requests": 1.0}}))
    scenario = write_scenario(tmp / "lacking.toml", ["fast.requests <= baseline"], requests=1)
    out = tmp / "out-lacking"
    proc = run_cli("run", str(scenario), "--out", str(out), "--baseline", str(baseline))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failure = _junit_cases(only_run_dir(out))["fast.requests <= baseline"].find("failure")
    assert failure is not None
    assert f"baseline {baseline} has no value for fast.requests" in failure.get("message", "")


def test_missing_baseline_exits_2_before_the_run_starts(tmp_path):
    scenario = write_scenario(
        tmp_path / "s.toml", ["fast.itl_p99_ms <= 1.2 * baseline"], name="zw-test-no-baseline"
    )
    out = tmp_path / "out"
    step = tmp_path / "step.md"
    proc = run_cli("run", str(scenario), "--out", str(out), env=_env(GITHUB_STEP_SUMMARY=str(step)))
    assert proc.returncode == 2
    assert proc.stderr == (
        "cannot load the baseline\nno baseline at results/baselines/zw-test-no-baseline.json: "
        "a gate refers to 'baseline'. Save one from a reference run with "
        "`zerowindow baseline save RUN_DIR`, or pass --baseline PATH\n"
    )
    assert not out.exists()  # nothing started
    # The job summary says why too.
    assert step.read_text().startswith(
        f"### ❌ zerowindow `{scenario}`: cannot load the baseline (exit 2)\n\n```\nno baseline at"
    )
    other = run_cli("run", str(scenario), "--out", str(out), "--baseline", str(tmp_path / "b"))
    assert other.returncode == 2 and f"no baseline at {tmp_path / 'b'}" in other.stderr
    both = run_cli("run", str(scenario), "--baseline", "b.json", "--no-baseline")
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_unknown_figure_exits_2_listing_the_valid_names(tmp_path):
    scenario = write_scenario(tmp_path / "s.toml", ["fast.tftt_p99_ms <= 800"])
    proc = run_cli("run", str(scenario), "--out", str(tmp_path / "out"))
    assert proc.returncode == 2
    assert f"{scenario}:5: field 'gates.0': gate 'fast.tftt_p99_ms <= 800': unknown figure" in (
        proc.stderr
    )
    assert "did you mean 'fast.ttft_p99_ms'" in proc.stderr
    assert (
        "valid figures: accelerator.memory_used_peak_bytes, client_saturated, duration_s, "
        "engine_held, engine_held_victims, fast."
        in proc.stderr
    )


def test_baseline_save_refuses_what_is_not_a_complete_run(tmp_path):
    proc = run_cli("baseline", "save", str(tmp_path))
    assert proc.returncode == 2
    assert f"{tmp_path}/summary.json: cannot read the run's summary" in proc.stderr


def test_interrupt_with_live_progress_on_a_terminal_exits_130_with_junit(tmp_path):
    """On a terminal the progress is a rich Live display; SIGINT still stops the run cleanly,
    and junit.xml says the run did not complete."""
    scenario = write_scenario(
        tmp_path / "long.toml",
        ["fast.requests >= 1"],
        name="long",
        requests=1000,
        max_duration_s=60,
    )
    out = tmp_path / "out"
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--out", str(out)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=terminal,
        stderr=terminal,
        env=_env(COLUMNS="120", TERM="xterm"),
    )
    os.close(terminal)
    output = b""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            records = list(out.glob("long/*/records-fast.jsonl"))
            if records and len(records[0].read_text().splitlines()) >= 4:
                break
            time.sleep(0.3)
        else:
            pytest.fail("no records appeared")
        time.sleep(1.5)  # at least one refresh of the live display with requests finished
        proc.send_signal(signal.SIGINT)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            output += chunk
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(controller)
    text = output.decode(errors="replace")
    assert proc.returncode == 130, text[-3000:]
    assert "phase" in text and "TTFT p50 ms" in text  # the live display was drawn
    run_dir = only_run_dir(out)
    error = ET.parse(run_dir / "junit.xml").getroot().find("testsuite/testcase[@name='run']/error")
    assert error is not None and "interrupted" in error.get("message", "")
    assert json.loads((run_dir / "run.json").read_text())["exit_code"] == 130


def test_the_example_ci_scenario_passes_its_gates_against_its_committed_baseline(tmp_path):
    """scenarios/sim-gates.toml (docs/ci.md) with results/baselines/sim-gates.json."""
    proc = run_cli("run", "scenarios/sim-gates.toml", "--out", str(tmp_path), "--no-progress")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = only_run_dir(tmp_path)
    gates = json.loads((run_dir / "gates.json").read_text())
    assert gates["baseline"] == "results/baselines/sim-gates.json"
    assert len(gates["gates"]) == 7 and all(g["passed"] for g in gates["gates"])
    assert "1 run(s) in its history" in gates["gates"][-1]["reason"]
    assert (REPO / gates["baseline"]).exists()
    assert f"history: 1 entry added to {tmp_path / 'history.duckdb'}" in proc.stdout
    # Its history gate, judged again (`zerowindow analyze`) after a past injected into the
    # history: twelve runs like it pass; ten runs 40 % faster, then two like it, make it (and
    # the two before it) a regression.
    (entry,) = folder_entries(run_dir)
    measured = entry.figures["fast.ttft_p99_ms"][0]
    for factor, code in ((1.0, 0), (0.6, 1)):
        store = tmp_path / "history.duckdb"
        store.unlink()
        with HistoryStore(store) as history:
            start = datetime.fromisoformat(entry.started_utc)
            history.add(
                dataclasses.replace(
                    entry,
                    entry_id=f"past-{i}",
                    gates=[],
                    figures={
                        "fast.ttft_p99_ms": (
                            measured * (factor if i < 10 else 1.0) * (1 + 0.02 * (i % 3)),
                            None,
                            None,
                        )
                    },
                    started_utc=(start - timedelta(hours=12 - i)).isoformat(),
                )  # fmt: skip
                for i in range(12)
            )
        again = run_cli("analyze", str(run_dir))
        assert again.returncode == code, again.stdout + again.stderr
        history_gate = json.loads((run_dir / "gates.json").read_text())["gates"][-1]
        assert history_gate["passed"] is (code == 0), history_gate
        assert "13 runs" in history_gate["reason"], history_gate


@pytest.mark.vllm
def test_the_tiny_model_ci_scenario_passes_its_gates_on_vllm(vllm_server, tmp_path):
    """scenarios/tiny-gates.toml (docs/ci.md's CPU workflow) on the session's real vLLM."""
    proc = run_cli(
        "run", "scenarios/tiny-gates.toml", "--target-url", vllm_server,
        "--out", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = _junit_cases(only_run_dir(tmp_path))
    assert "kv_held_after_finish_s <= 1" in cases
    assert all(c.find("failure") is None for c in cases.values())
