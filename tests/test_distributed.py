"""Distributed load on Locust's master/worker engine, against the engine emulator: every request
recorded exactly once across workers, a killed worker reported with what it had finished, a
remote worker's records forwarded into the run folder."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from harness.lifecycle import run_scenario
from harness.lifecycle._distributed import (
    DistributedError,
    DistributedLoad,
    Distribution,
    parse_address,
    worker_reports,
)
from harness.scenario import RunOptions, Scenario, load_scenario, make_plan
from loadgen import group_file, group_files, worker_of, workers_log
from tests.conftest import REPO, ZEROWINDOW, only_run_dir
from zwcore import ScenarioError


def sim_scenario(*, users: int, requests_per_user: int, max_tokens: int, step_ms: float) -> dict:
    return {
        "name": "dist",
        "max_duration_s": 90,
        "cooldown_s": 0.5,
        "target": {
            "kind": "sim",
            "engine": {
                "step_fixed_ms": step_ms,
                "decode_ms_per_seq": 0.05,
                "num_blocks": 1024,
                "max_num_seqs": 64,
            },
        },  # fmt: skip
        "groups": [
            {
                "name": "fast",
                "users": users,
                "requests_per_user": requests_per_user,
                "prompt_tokens": 8,
                "max_tokens": max_tokens,
            }
        ],  # fmt: skip
    }


def locust_e2e_count(run_dir: Path, group: str) -> int:
    """Requests the Locust master counted (its --json-file statistics)."""
    stats = json.loads((run_dir / f"locust-stats-{group}.json").read_text())
    [e2e] = [e for e in stats if e["name"] == group and e["method"] == "E2E"]
    return int(e2e["num_requests"])


def jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_workers_record_every_request_exactly_once(tmp_path: Path) -> None:
    scenario = Scenario.model_validate(
        sim_scenario(users=6, requests_per_user=5, max_tokens=24, step_ms=2.0)
    )
    result = run_scenario(scenario, out_root=tmp_path, workers=2)
    assert result.exit_code == 0, result.summary.failure
    run_dir = result.run_dir
    files = group_files(run_dir, "records", "fast")
    assert [worker_of(f) for f in files] == ["w1", "w2"]  # no single-process file
    per_worker = {worker_of(f): jsonl(f) for f in files}
    assert all(len(rows) > 0 for rows in per_worker.values()), "both workers ran users"
    ids = [r["request_id"] for rows in per_worker.values() for r in rows]
    assert len(ids) == len(set(ids)) == 6 * 5
    assert locust_e2e_count(run_dir, "fast") == 30
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(requests) == 30 and requests["request_id"].is_unique
    assert set(requests["request_id"]) == set(ids)
    assert (requests["outcome"] == "complete").all()
    assert result.summary.groups[0].requests == 30
    workers = result.summary.load_workers
    assert [(w.worker, w.status) for w in workers] == [("w1", "finished"), ("w2", "finished")]
    assert sum(w.requests_recorded for w in workers) == 30
    # Every load process sampled its own saturation.
    sampled = {p.group for p in result.summary.client_saturation.processes}
    assert sampled == {"fast@w1", "fast@w2"}
    info = json.loads((run_dir / "run.json").read_text())
    [load] = info["load_processes"]
    assert "--master" in load["argv"] and load["expected_workers"] == 2
    assert [w["name"] for w in load["workers"]] == ["w1", "w2"]
    assert all(w["exit_code"] == 0 for w in load["workers"])


def _wait_for(predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _hello_pid(run_dir: Path, worker: str) -> int | None:
    log = run_dir / "workers-fast.jsonl"
    if not log.exists():
        return None
    for event in jsonl(log):
        if event["event"] == "hello" and event["worker"] == worker:
            return int(event["pid"])
    return None


def test_killed_worker_is_reported_and_its_records_kept(tmp_path: Path) -> None:
    # ~100 tokens at ~6 ms per step: each request lasts about 0.6 s, each user 12 of them.
    data = sim_scenario(users=4, requests_per_user=12, max_tokens=100, step_ms=6.0)
    toml = _to_toml(data)
    scenario = tmp_path / "dist.toml"
    scenario.write_text(toml)
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--workers", "2", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        run_dir = _wait_for(lambda: next(iter(out.glob("dist/*")), None), 30, "the run folder")
        w2 = group_file(run_dir, "records", "fast", "w2")
        _wait_for(lambda: w2.exists() and w2.read_text().count("\n") >= 2, 60, "w2 records")
        pid = _wait_for(lambda: _hello_pid(run_dir, "w2"), 10, "w2's hello")
        os.kill(pid, signal.SIGKILL)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, output
    assert "load worker w2 of group fast was killed by SIGKILL after" in output
    summary = json.loads((run_dir / "summary.json").read_text())
    workers = {w["worker"]: w for w in summary["load_workers"]}
    assert workers["w1"]["status"] == "finished"
    assert workers["w2"]["status"] == "died" and workers["w2"]["detail"] == "was killed by SIGKILL"
    w2_rows = jsonl(w2)
    assert workers["w2"]["requests_recorded"] == len(w2_rows) >= 2
    assert summary["status"] == "failed" and "after" in summary["failure"]
    # Nothing the dead worker had written is lost, nothing is counted twice.
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert requests["request_id"].is_unique
    assert {r["request_id"] for r in w2_rows} <= set(requests["request_id"])
    w1_rows = jsonl(group_file(run_dir, "records", "fast", "w1"))
    assert len(requests) == len(w1_rows) + len(w2_rows) < 4 * 12
    # w1's users ran to the end: its two users' 24 requests.
    assert len(w1_rows) == 24 and all(r["outcome"] == "complete" for r in w1_rows)
    events = [e["event"] for e in jsonl(run_dir / "workers-fast.jsonl") if e.get("worker") == "w2"]
    assert "missing" in events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_remote_worker_forwards_its_records_to_the_run_folder(tmp_path: Path) -> None:
    scenario = tmp_path / "dist.toml"
    scenario.write_text(
        _to_toml(sim_scenario(users=4, requests_per_user=4, max_tokens=24, step_ms=2.0))
    )
    out, remote_out = tmp_path / "out", tmp_path / "remote"
    port = _free_port()
    run = subprocess.Popen(
        [*ZEROWINDOW, "run", str(scenario), "--workers", "1", "--remote-workers", "1",
         "--master-bind", f"127.0.0.1:{port}", "--out", str(out)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    worker = subprocess.Popen(
        [*ZEROWINDOW, "worker", "--master", f"127.0.0.1:{port}", "--out", str(remote_out),
         "--name", "r1"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        output, _ = run.communicate(timeout=120)
        worker_output, _ = worker.communicate(timeout=30)
    finally:
        for p in (run, worker):
            if p.poll() is None:
                p.kill()
    assert run.returncode == 0, output
    assert worker.returncode == 0, worker_output
    run_dir = only_run_dir(out)
    forwarded = group_file(run_dir, "records", "fast", "r1")
    local_copy = group_file(remote_out, "records", "fast", "r1")
    assert forwarded.read_text() == local_copy.read_text() != ""
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(requests) == 16 and requests["request_id"].is_unique
    assert locust_e2e_count(run_dir, "fast") == 16
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {(w["worker"], w["status"]) for w in summary["load_workers"]} == {
        ("w1", "finished"),
        ("r1", "finished"),
    }
    # The remote worker's saturation samples reached the run folder too.
    assert group_file(run_dir, "saturation", "fast", "r1").read_text().count("\n") >= 1


def test_distribution_settings_are_checked() -> None:
    assert parse_address("127.0.0.1:5557") == ("127.0.0.1", 5557)
    assert parse_address("0.0.0.0", default_port=0) == ("0.0.0.0", 0)
    for bad in ("127.0.0.1", "host:port", ":80", "h:70000"):
        with pytest.raises(DistributedError, match="HOST:PORT"):
            parse_address(bad)
    with pytest.raises(DistributedError, match="at least one worker"):
        Distribution(workers=0)
    d = Distribution(workers=2, master_host="0.0.0.0", master_port=6000)
    assert d.for_group(1)["master_bind"] == ("0.0.0.0", 6001)
    assert Distribution(workers=1).for_group(3)["master_bind"] == ("127.0.0.1", 0)
    with pytest.raises(ValueError, match="invalid worker name"):
        group_file("/tmp", "records", "g", "a/b")
    # Shaped links: masters and workers run in the groups' namespaces, on their loopback.
    shaped = load_scenario(REPO / "scenarios" / "shaped-links.toml")
    make_plan(shaped, RunOptions(workers=2))
    make_plan(shaped, RunOptions(workers=2, master_bind="0.0.0.0:0"))
    with pytest.raises(ScenarioError, match="workers on other machines cannot reach"):
        make_plan(shaped, RunOptions(workers=1, remote_workers=1))
    with pytest.raises(ScenarioError, match="--master-bind 10.1.2.3:0 with network profiles"):
        make_plan(shaped, RunOptions(workers=1, master_bind="10.1.2.3:0"))
    # A comparison starts masters of its own for each run: remote workers would quit.
    comparison = load_scenario(REPO / "scenarios" / "sim-proxy-comparison.toml")
    make_plan(comparison, RunOptions(workers=2))
    with pytest.raises(ScenarioError, match="quit with their master"):
        make_plan(comparison, RunOptions(remote_workers=1))


def test_cli_rejects_bad_worker_options(tmp_path: Path) -> None:
    scenario = tmp_path / "dist.toml"
    scenario.write_text(
        _to_toml(sim_scenario(users=1, requests_per_user=1, max_tokens=4, step_ms=1))
    )
    bad = subprocess.run(
        [*ZEROWINDOW, "run", str(scenario), "--workers", "1", "--master-bind", "nowhere:x"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert bad.returncode == 2 and "expected HOST:PORT" in bad.stderr
    assert "Traceback" not in bad.stderr
    worker = subprocess.run(
        [*ZEROWINDOW, "worker", "--master", "127.0.0.1:1", "--name", "bad/name"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert worker.returncode == 2 and "invalid worker name" in worker.stderr


def _to_toml(data: dict) -> str:
    """A scenario dict as TOML (just what these scenarios use)."""

    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        return repr(v)

    lines = [f"{k} = {value(v)}" for k, v in data.items() if not isinstance(v, dict | list)]
    target = dict(data["target"])
    engine = target.pop("engine")
    lines += ["[target]", *(f"{k} = {value(v)}" for k, v in target.items())]
    lines += ["[target.engine]", *(f"{k} = {value(v)}" for k, v in engine.items())]
    for group in data["groups"]:
        lines += ["[[groups]]", *(f"{k} = {value(v)}" for k, v in group.items())]
    return "\n".join(lines) + "\n"


def test_worker_reports_from_the_masters_log(tmp_path: Path) -> None:
    """Remote workers are known only from the master's log: one went missing, one never came."""
    master = subprocess.Popen(["true"])
    master.wait()
    load = DistributedLoad(
        "g", ["locust"], master, tmp_path / "records-g.jsonl", tmp_path / "locust-g.log",
        master_address="127.0.0.1:1", expected_workers=3,
    )  # fmt: skip
    log = workers_log(tmp_path, "g")
    events = [
        {"t": 1, "event": "hello", "client_id": "a", "worker": "r1", "host": "h1", "pid": 11},
        {"t": 1, "event": "hello", "client_id": "b", "worker": "r2", "host": "h2", "pid": 12},
        {"t": 5, "event": "missing", "client_id": "b", "worker": "r2"},
        {"t": 6, "event": "missing", "client_id": "a", "worker": "r1"},
        {"t": 7, "event": "back", "client_id": "a", "worker": "r1"},
    ]
    log.write_text("".join(json.dumps(e) + "\n" for e in events) + '{"t": 8, "ev')
    group_file(tmp_path, "records", "g", "r2").write_text('{"a": 1}\n{"a": 2}\n{"a"')
    reports = worker_reports(load, tmp_path)
    assert [(r.worker, r.status, r.requests_recorded) for r in reports] == [
        ("r1", "finished", 0),
        ("r2", "died", 2),
        ("(1 remote)", "never_joined", 0),
    ]
    assert reports[1].message == (
        "load worker r2 of group g stopped sending heartbeats to its master after 2 recorded "
        "requests"
    )
    assert reports[2].message.endswith("never joined its master (2 of 3 workers did)")
