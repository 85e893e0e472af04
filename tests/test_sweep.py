"""``zerowindow sweep`` on the engine emulator, whose capacity follows from its configuration:
4 sequences per batch, every step 10 ms plus 0.5 ms per sequence, 20 output tokens a request,
so a full batch finishes 4 requests every 20 steps of 12 ms: 16.7 requests/s. The sweep's
throughput run must find that within 15 %, its rates lie between the serial and throughput
runs, the SLA bisection lands below the capacity, and it writes its table and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import only_run_dir, run_cli

CAPACITY_RPS = 4 / (20 * (10.0 + 4 * 0.5) / 1000)
SCENARIO = """
name = "sim-sweep"
seed = 0
max_duration_s = 60
cooldown_s = 0.5
gates = ["traffic.ttft_p99_ms <= 1500"]

[target]
kind = "sim"

[target.engine]
max_num_seqs = 4
num_blocks = 256
step_fixed_ms = 10.0
decode_ms_per_seq = 0.5
prefill_ms_per_token = 0.0

[[groups]]
name = "traffic"
arrival = { kind = "poisson", rate_rps = 5, requests = 40 }
prompt_tokens = 8
max_tokens = 20
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sweep")
    scenario = root / "sweep.toml"
    scenario.write_text(SCENARIO)
    done = run_cli(
        "sweep", str(scenario), "--steps", "1", "--serial-requests", "8", "--sla",
        "--sla-steps", "2", "--goodput", "ttft:1000", "--goodput", "tpot:40",
        "--out", str(root / "out"), timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return only_run_dir(root / "out")


def test_the_throughput_run_finds_the_capacity(sweep: Path) -> None:
    data = json.loads((sweep / "sweep.json").read_text())
    assert data["capacity_rps"] == pytest.approx(CAPACITY_RPS, rel=0.15)
    phases = [p["phase"] for p in data["points"]]
    assert phases == ["serial", "throughput", "rate", "sla", "sla"]
    serial, most = data["points"][0], data["points"][1]
    assert serial["completed_rps"] < most["completed_rps"]
    rates = [p["offered_rps"] for p in data["points"] if p["phase"] == "rate"]
    assert all(serial["completed_rps"] < r < most["completed_rps"] for r in rates)
    assert all(p["status"] == "complete" and p["requests"] for p in data["points"])
    offered = [p["offered_rps"] for p in data["points"] if p["offered_rps"]]
    assert data["kept_up_rps"] in offered
    assert data["goodput_slo_ms"] == {"ttft": 1000.0, "tpot": 40.0}
    assert all(p["goodput_rps"] <= p["completed_rps"] + 1e-9 for p in data["points"])
    assert serial["goodput_rps"] == pytest.approx(serial["completed_rps"])  # no queue: all good


def test_the_sla_search_lands_below_the_capacity(sweep: Path) -> None:
    data = json.loads((sweep / "sweep.json").read_text())
    sla = [p for p in data["points"] if p["phase"] == "sla"]
    passed = [p["offered_rps"] for p in sla if p["gates_passed"]]
    assert data["sla_rps"] == (max(passed) if passed else None)
    assert all(p["offered_rps"] < data["capacity_rps"] * 1.15 for p in sla)


def test_each_run_is_a_run_folder_and_the_sweep_has_its_table_and_plots(sweep: Path) -> None:
    data = json.loads((sweep / "sweep.json").read_text())
    for p in data["points"]:
        assert (sweep / p["label"] / "summary.json").exists(), p["label"]
    assert "| run | offered req/s |" in (sweep / "sweep.md").read_text()
    page = (sweep / "sweep.html").read_text()
    assert "plotly" in page and "TTFT (ms)" in page
    record = json.loads((sweep / "plan.json").read_text())
    assert record["exit_code"] == 0 and record["plan"]["kind"] == "sweep"
    assert [r["path"] for r in record["runs"]] == [p["label"] for p in data["points"]]


def test_a_scenario_without_an_open_loop_group_is_refused(tmp_path: Path) -> None:
    closed = SCENARIO.replace(
        'arrival = { kind = "poisson", rate_rps = 5, requests = 40 }',
        "users = 2\nrequests_per_user = 1",
    )
    path = tmp_path / "closed.toml"
    path.write_text(closed)
    done = run_cli("sweep", str(path), "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "a sweep needs a group with arrival" in done.stderr
    done = run_cli("sweep", str(path), "--rates", "2,x", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "--rates: 'x' is not a number" in done.stderr
    done = run_cli("sweep", str(path), "--goodput", "ttfb:3", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert "expected KEY:MS with KEY one of ttft, tpot, e2el" in done.stderr


def test_the_concurrency_search_finds_the_highest_ceiling_that_passes(tmp_path: Path) -> None:
    from harness.lifecycle import run
    from harness.scenario import RunOptions, SweepSettings, parse_scenario

    # 12 requests at once, at most c in flight: up to c = 4 (the engine's batch) each is
    # scheduled as it arrives and its first token comes within a step or two; above, the
    # fifth waits in the engine's queue for a whole request (~0.5 s). A 300 ms TTFT bound
    # (from the send) therefore holds up to 4: the bisection must find the batch size.
    text = SCENARIO.replace("requests = 40", "requests = 12").replace("1500", "300")
    # The engine of 8.3 requests/s (20 ms steps, 1 ms per sequence): a whole request ~0.5 s.
    text = text.replace("step_fixed_ms = 10.0", "step_fixed_ms = 20.0")
    text = text.replace("decode_ms_per_seq = 0.5", "decode_ms_per_seq = 1.0")
    settings = SweepSettings(
        steps=0, sla=True, sla_on="concurrency", sla_steps=4, serial_requests=4
    )
    result = run(
        parse_scenario(text, path=tmp_path / "s.toml"), RunOptions(sweep=settings),
        out_root=tmp_path,
    )  # fmt: skip
    assert result.exit_code == 0, result.failure
    assert result.sweep is not None
    points = result.sweep.points
    searched = [(p.max_concurrency, p.gates_passed) for p in points if p.phase == "sla"]
    assert len(searched) >= 2
    passing = [c for c, ok in searched if ok]
    assert result.sweep.sla_concurrency == (max(passing) if passing else None)
    assert result.sweep.sla_concurrency == 4, searched
