"""End to end against a real vLLM server (CPU build, tiny model): tokens, Send-Q, KV verdict,
interruption and engine death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import psutil
import pytest

from harness.lifecycle import run_scenario
from harness.scenario import parse_scenario
from tests.conftest import REPO, VLLM_ARGS, ZEROWINDOW, only_run_dir, tiny_model  # noqa: F401

# Two users that would stream for minutes: the load a run is stopped or killed in the middle of.
LONG_LOAD = """
[[groups]]
name = "fast"
users = 2
requests_per_user = 1000
max_tokens = 32
"""

pytestmark = pytest.mark.vllm


def _scenario(
    url: str, groups: str, *, name: str = "it", extra: str = "", engine_dir: Path | None = None
) -> str:
    engine = f'engine_dir = "{engine_dir}"' if engine_dir else ""
    return f"""
name = "{name}"
cooldown_s = 2
{extra}
[target]
kind = "url"
url = "{url}"
served_model_name = "tiny"
{engine}
{groups}
"""


def _run(text: str, out: Path):
    scenario = parse_scenario(text, path=Path("it.toml"))
    result = run_scenario(scenario, out_root=out)
    return result, result.run_dir


def test_full_speed_readers_receive_exactly_max_tokens(vllm_server, tmp_path):
    groups = """
[[groups]]
name = "completions"
users = 2
requests_per_user = 2
max_tokens = 64
[[groups]]
name = "chat"
users = 1
requests_per_user = 2
max_tokens = 48
endpoint = "chat"
"""
    result, run_dir = _run(_scenario(vllm_server, groups), tmp_path)
    assert result.exit_code == 0, result.summary.failure
    requests = pd.read_parquet(run_dir / "requests.parquet")
    chunks = pd.read_parquet(run_dir / "chunks.parquet")
    assert len(requests) == 6
    assert set(requests["outcome"]) == {"complete"}
    expected = requests["group"].map({"completions": 64, "chat": 48})
    assert (requests["completion_tokens"] == expected).all()
    per_request = chunks.groupby("request_id")["tokens"].sum()
    assert (per_request.loc[requests["request_id"]].to_numpy() == expected.to_numpy()).all()
    assert (requests["ttft_ms"] > 0).all()
    summary = json.loads((run_dir / "summary.json").read_text())
    fast = {g["group"]: g for g in summary["groups"]}["completions"]
    # On 2 busy cores a stream of 64 tokens can arrive in one recv (every gap 0): ITL is
    # computed, but its size is not a property of the toolkit.
    assert fast["itl_p50_ms"] is not None and fast["itl_p99_ms"] >= 0
    assert fast["output_tokens"] == 2 * 2 * 64
    metrics = pd.read_parquet(run_dir / "server_metrics.parquet")
    # Short requests can fall between two scrapes; the success counter cannot.
    assert metrics["scrape_ok"].all()
    finished = metrics["request_success_length"].fillna(0)
    assert finished.iloc[-1] - finished.iloc[0] == 6
    info = json.loads((run_dir / "run.json").read_text())
    # A url target: the run did not start the server, so its version is not known (a local
    # package does not stand for a server elsewhere); the toolkit's own are.
    assert info["status"] == "complete" and "vllm" not in info["versions"]
    assert info["versions"]["zerowindow"] and info["versions"]["locust"]
    # A url target without engine_dir: no engine records, and the verdict says so.
    assert info["engine_probe"]["status"] == "not_run"
    verdict = summary["verdicts"]["kv_held_by_undelivered_streams"]
    assert verdict["source"] == "scrapes" and "scrape-only" in verdict["line"], verdict


def test_stalled_reader_fills_send_q_while_vllm_frees_kv(vllm_server, vllm_engine_dir, tmp_path):
    groups = """
[[groups]]
name = "fast"
users = 2
requests_per_user = 2
max_tokens = 128
[[groups]]
name = "slow"
users = 4
requests_per_user = 1
max_tokens = 512
rcvbuf_bytes = 4096
read = { kind = "paced", bytes_per_read = 64, interval_s = 0.1 }
action = { kind = "stop_reading", after_tokens = 8, hold_s = 8 }
"""
    text = _scenario(vllm_server, groups, name="stall", engine_dir=vllm_engine_dir)
    result, run_dir = _run(text, tmp_path)
    assert result.exit_code == 0, result.summary.failure
    requests = pd.read_parquet(run_dir / "requests.parquet")
    sockets = pd.read_parquet(run_dir / "sockets.parquet")
    metrics = pd.read_parquet(run_dir / "server_metrics.parquet")
    slow = requests[requests["group"] == "slow"]
    assert len(slow) == 4
    # Observed through /proc/net/tcp: the server's sockets to the slow readers hold data.
    assert (slow["server_send_q_peak_bytes"] > 4096).all(), slow["server_send_q_peak_bytes"]
    slow_ports = set(slow["client_port"])
    stalled = sockets[sockets["client_port"].isin(slow_ports) & (sockets["send_q_bytes"] > 0)]
    # vLLM's KV usage is back at 0 while those bytes are still undelivered.
    idle = metrics[(metrics["num_requests_running"] == 0) & (metrics["kv_cache_usage"] == 0)]
    overlap = idle[(idle["t"] > stalled["t"].min()) & (idle["t"] < stalled["t"].max())]
    assert len(overlap) >= 4
    verdict = result.summary.verdicts["kv_held_by_undelivered_streams"]
    assert verdict["status"] == "none", verdict
    assert "none held" in verdict["line"]
    assert verdict["window_s"] >= 3
    # The engine's own records: every request joined its engine request, and each stalled
    # reader's KV was freed at its generation end while its output was still undelivered.
    assert verdict["source"] == "engine_probe" and verdict["agreement"] == "agree", verdict
    assert requests["engine_request_id"].notna().all()
    assert all(
        e.startswith(s + "-")
        for e, s in zip(requests["engine_request_id"], requests["stream_id"], strict=True)
    )
    assert (slow["kv_held_after_generation_ms"] < 100).all(), slow["kv_held_after_generation_ms"]
    assert (slow["undelivered_tokens_at_kv_free"] > 100).all()
    assert verdict["requests_undelivered_at_kv_free"] >= 4  # a fast stream may lag too
    assert verdict["engine_requests_unjoined"] == 0
    assert f"{len(requests)} of {len(requests)} requests freed KV" in verdict["line"]
    server = result.summary.server
    assert server.figures_source == "engine_probe" and server.engine_steps > 100
    assert server.kv_cache_usage_peak_perc > 0
    steps = pd.read_parquet(run_dir / "engine_steps.parquet")
    assert steps["t"].is_monotonic_increasing and steps["kv_cache_usage"].iloc[-1] == 0
    # The pool the usage is a fraction of: 64 blocks (VLLM_ARGS) less vLLM's null block.
    info = json.loads((run_dir / "run.json").read_text())
    assert info["engine_probe"]["kv_cache_blocks"] == 63
    # A block in bytes, from vLLM's KV cache config: 32 tokens x 2 layers x 2 KV heads x
    # (64 + 64) head dims (K and V) x 2 bytes (bfloat16) (harness/servers/_tiny_model.py)
    assert info["engine_probe"]["kv_block_bytes"] == 32 * 2 * 2 * (64 + 64) * 2
    assert verdict["kv_cache_bytes"] == 63 * 32 * 2 * 2 * (64 + 64) * 2
    assert verdict["kv_held_peak_bytes"] == 0  # none held
    assert (requests["engine_kv_blocks_freed"] > 0).all()


def test_sigterm_keeps_partial_results(vllm_server, tmp_path):
    scenario = tmp_path / "long.toml"
    scenario.write_text(
        _scenario(
            vllm_server,
            LONG_LOAD,
            name="long",
        )
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        records = list(out.glob("long/*/records-fast.jsonl"))
        if records and len(records[0].read_text().splitlines()) >= 3:
            break
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("no records appeared")
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    run_dir = only_run_dir(out)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "interrupted" and "SIGTERM" in info["failure"]
    assert len(pd.read_parquet(run_dir / "requests.parquet")) >= 3
    # Every load process is gone.
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(run_dir) in " ".join(p.info["cmdline"] or [])
    ]


def test_killing_the_target_mid_run_keeps_partial_records_and_reason(tmp_path):
    # The target a run started dies mid-load (here the emulator: the check is the same for
    # every target kind the run starts; a killed harness on vLLM is the test below).
    scenario = tmp_path / "die.toml"
    scenario.write_text(
        """
name = "die"
[target]
kind = "sim"
[target.engine]
step_fixed_ms = 5.0
"""
        + LONG_LOAD
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            records = list(out.glob("die/*/records-fast.jsonl"))
            if records and len(records[0].read_text().splitlines()) >= 3:
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no records appeared: {proc.communicate(timeout=30)[0]}")
        servers = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "harness._sim" in " ".join(p.cmdline())
        ]
        assert servers
        os.killpg(os.getpgid(servers[0].pid), signal.SIGKILL)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output
    run_dir = only_run_dir(out)
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed"
    assert "exited" in info["failure"] or "stopped answering" in info["failure"]
    assert info["failure"] in output.replace("\n", " ") or "failed" in output
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert (requests["outcome"] == "complete").sum() >= 3
    assert (run_dir / "sim.log").exists()


def test_a_killed_harness_takes_its_vllm_with_it(tiny_model, tmp_path):  # noqa: F811
    """SIGKILL of ``zerowindow run`` (a CI time limit, the OOM killer) once the vLLM it started
    runs its API server and engine core: within 5 s no process of the run is left, vLLM's
    included (on a GPU runner an orphan would hold the GPU), and ``analyze`` ends the folder
    as killed. (Killed mid-load, the emulator's runs show the same reaper, and the requests
    recorded before the kill: test_run_endings, test_netem_topology.)"""
    scenario = tmp_path / "orphan.toml"
    scenario.write_text(
        f"""
name = "orphan"
[target]
kind = "vllm"
model = "{tiny_model}"
extra_args = [{", ".join(f'"{a}"' for a in [*VLLM_ARGS, "--enforce-eager"])}]
"""
        + LONG_LOAD
    )
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--out", str(out)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            children = psutil.Process(proc.pid).children(recursive=True)
            names = [" ".join(_cmdline(c)) for c in children]
            if any("api_server" in n for n in names) and any("EngineCore" in n for n in names):
                break
            time.sleep(0.2)
        else:
            pytest.fail("vLLM never started its engine core")
        proc.kill()
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 5
    while True:
        left = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not left, [" ".join(_cmdline(c)) for c in left]
    run_dir = only_run_dir(out)
    done = subprocess.run(
        [*ZEROWINDOW, "analyze", str(run_dir)], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "killed", info.get("failure")
    # A vllm target the run started: its kind says which vLLM and torch it ran.
    assert info["versions"]["vllm"] and info["versions"]["torch"]
    assert (run_dir / "vllm.log").exists()


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
