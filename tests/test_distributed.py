"""Distributed load on Locust's master/worker engine, against the engine emulator: every request
recorded exactly once across workers, a killed worker reported with what it had finished, a
remote worker's records forwarded into the run folder."""

from __future__ import annotations

import json
import os
import shutil
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
from netem import has_net_admin
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
    # ~100 tokens at ~6 ms per step: each request lasts about 0.6 s, each user 8 of them.
    data = sim_scenario(users=4, requests_per_user=8, max_tokens=100, step_ms=6.0)
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
    assert len(requests) == len(w1_rows) + len(w2_rows) < 4 * 8
    # w1's users ran to the end: its two users' 16 requests.
    assert len(w1_rows) == 16 and all(r["outcome"] == "complete" for r in w1_rows)
    events = [e["event"] for e in jsonl(run_dir / "workers-fast.jsonl") if e.get("worker") == "w2"]
    assert "missing" in events


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


AHEAD_S = 1000.0  # the remote worker's clock: this far ahead of the harness's
# An open-loop trace of 16 requests, 60 ms apart, that two workers share.
TRACE_SCENARIO = """
name = "dist"
max_duration_s = 90
cooldown_s = 0.5
[target]
kind = "sim"
host = "{host}"
[target.engine]
step_fixed_ms = 2.0
decode_ms_per_seq = 0.05
num_blocks = 1024
max_num_seqs = 64
[[groups]]
name = "fast"
arrival = {{ kind = "trace", format = "mooncake", path = "{trace}" }}
"""
_NS_ADDR, _HARNESS_ADDR = "198.19.254.2", "198.19.254.1"  # a /30 of the benchmark range


def _own_clock_and_network() -> list[str] | None:
    """A command prefix that runs a program in a network namespace of its own (a veth pair to
    this one: it is at 198.19.254.2, this namespace at .1) and a time namespace whose
    CLOCK_MONOTONIC is AHEAD_S ahead (time_namespaces(7), ``unshare --time --monotonic``);
    None where this machine cannot (no CAP_NET_ADMIN, no time namespaces)."""
    if not has_net_admin() or shutil.which("ip") is None:
        return None
    probe = subprocess.run(
        ["unshare", "--time", "--monotonic", str(int(AHEAD_S)), "true"], capture_output=True
    )
    if probe.returncode != 0:
        return None
    ns, tag = f"zwtest-clock-{os.getpid()}", f"zwtc{os.getpid() % 100000}"
    for cmd in (
        f"ip netns add {ns}",
        f"ip link add {tag}a type veth peer name {tag}b",
        f"ip link set {tag}b netns {ns}",
        f"ip addr add {_HARNESS_ADDR}/30 dev {tag}a",
        f"ip link set {tag}a up",
        f"ip -n {ns} addr add {_NS_ADDR}/30 dev {tag}b",
        f"ip -n {ns} link set {tag}b up",
        f"ip -n {ns} link set lo up",
    ):
        subprocess.run(cmd.split(), check=True, capture_output=True)
    return ["ip", "netns", "exec", ns, "unshare", "--time", "--monotonic", str(int(AHEAD_S))]


def _remove_own_network() -> None:
    ns, tag = f"zwtest-clock-{os.getpid()}", f"zwtc{os.getpid() % 100000}"
    subprocess.run(["ip", "link", "del", f"{tag}a"], capture_output=True)
    subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_remote_worker_on_its_own_clock_joins_the_harness_clock(tmp_path: Path) -> None:
    """A remote worker (``zerowindow worker``) in a network namespace and a time namespace of
    its own, its CLOCK_MONOTONIC 1,000 s ahead, shares a trace's open-loop schedule with a
    local worker: the plan reaches it through the master, its records reach the run folder
    the same way, its clock is measured, and its requests land on the harness's clock: each
    joins its engine record in causal order, as a local worker's do. Where the machine has no
    namespaces, the worker runs beside the harness (the rest is still tested)."""
    prefix = _own_clock_and_network()
    try:
        address = _HARNESS_ADDR if prefix else "127.0.0.1"
        trace = tmp_path / "trace.jsonl"
        trace.write_text("".join(
            json.dumps({"timestamp": 60 * i, "input_length": 8, "output_length": 24}) + "\n"
            for i in range(16)
        ))  # fmt: skip
        scenario = tmp_path / "dist.toml"
        scenario.write_text(TRACE_SCENARIO.format(host=address, trace=trace))
        out, remote_out = tmp_path / "out", tmp_path / "remote"
        port = _free_port()
        run = subprocess.Popen(
            [*ZEROWINDOW, "run", str(scenario), "--workers", "1", "--remote-workers", "1",
             "--master-bind", f"{address}:{port}", "--out", str(out), "--no-progress"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        worker = subprocess.Popen(
            [*(prefix or []), *ZEROWINDOW, "worker", "--master", f"{address}:{port}",
             "--out", str(remote_out), "--name", "w1"],
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            output, _ = run.communicate(timeout=120)
            worker_output, _ = worker.communicate(timeout=30)
        finally:
            for p in (run, worker):
                if p.poll() is None:
                    p.kill()
    finally:
        if prefix:
            _remove_own_network()
    assert run.returncode == 0, output
    assert worker.returncode == 0, worker_output
    run_dir = only_run_dir(out)
    # It asked for w1, the local worker's name: it joined as w1-2, its lines in their own files.
    forwarded = group_file(run_dir, "records", "fast", "w1-2")
    local_copy = group_file(remote_out, "records", "fast", "w1")
    assert forwarded.read_text() == local_copy.read_text() != ""
    assert group_file(run_dir, "saturation", "fast", "w1-2").read_text().count("\n") >= 1
    assert locust_e2e_count(run_dir, "fast") == 16
    summary = json.loads((run_dir / "summary.json").read_text())
    workers = {w["worker"]: w for w in summary["load_workers"]}
    assert {(n, w["status"]) for n, w in workers.items()} == {
        ("w1", "finished"),
        ("w1-2", "finished"),
    }
    # The local worker shares the harness's clock; the remote one's was measured.
    assert workers["w1"]["clock"] is None
    clock = workers["w1-2"]["clock"]
    assert workers["w1-2"]["detail"] == "finished (it asked for the name w1, taken)"
    assert clock["samples"] >= 5 and 0 < clock["bound_ms"] < 50, clock
    ahead = AHEAD_S if prefix else 0.0
    assert abs(clock["offset_s"] - ahead) <= clock["bound_ms"] / 1000 + 1e-4, clock
    assert summary["clock_bound_ms"] == clock["bound_ms"]
    kv_held = summary["verdicts"]["kv_held_by_undelivered_streams"]
    assert kv_held["clock_bound_ms"] == clock["bound_ms"]
    assert f"(remote workers' clocks within {clock['bound_ms']:.3f} ms)" in kv_held["line"]
    assert f"worker w1-2 of group fast: clock {clock['offset_s']:+.6f} s" in output
    # Every request joined its engine record, in causal order within the bound: the engine
    # saw it after the client sent it, and made each token before the client read it.
    requests = pd.read_parquet(run_dir / "requests.parquet")
    assert len(requests) == 16 and requests["request_id"].is_unique
    assert requests["engine_request_id"].notna().all()
    remote = requests["clock_bound_ms"].notna()
    assert remote.sum() == workers["w1-2"]["requests_recorded"] > 0
    assert workers["w1"]["requests_recorded"] > 0
    # The trace's plan, split between the workers: each request once, each sent on time.
    assert sorted(requests["schedule_index"]) == list(range(16))
    # One start for both shares: on the harness's clock the deadlines are the trace's, 60 ms
    # apart, whichever worker sent them (within the clock bound and a millisecond).
    deadlines = requests.sort_values("schedule_index")["t_scheduled"]
    gaps_ms = deadlines.diff().dropna() * 1000
    assert ((gaps_ms - 60).abs() <= clock["bound_ms"] + 1.0).all(), gaps_ms.tolist()
    assert (requests["send_lag_ms"] < 500).all(), requests["send_lag_ms"].describe()
    assert (requests["outcome"] == "complete").all()
    # The saturation guard's verdict covers both workers.
    sampled = {p["group"] for p in summary["client_saturation"]["processes"]}
    assert sampled == {"fast@w1", "fast@w1-2"}
    slack_s = requests["clock_bound_ms"].fillna(0.0) / 1000 + 1e-4
    assert (requests["t_engine_arrival"] >= requests["t_send"] - slack_s).all()
    assert (requests["t_engine_first_token"] <= requests["t_first_token"] + slack_s).all()
    assert (requests["t_generation_end"] <= requests["t_last_byte"] + slack_s).all()
    # From send to the engine's arrival: the same for both workers, but for the bound and
    # the machine's noise.
    transit_ms = (requests["t_engine_arrival"] - requests["t_send"]) * 1000
    local_ms, remote_ms = transit_ms[~remote].median(), transit_ms[remote].median()
    assert abs(remote_ms - local_ms) <= clock["bound_ms"] + 20, (local_ms, remote_ms)
    # The figures are drawn from the folder alone: analyze gives the same ones.
    again = subprocess.run(
        [*ZEROWINDOW, "analyze", str(run_dir)], cwd=REPO, capture_output=True, text=True
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        json.loads((run_dir / "summary.json").read_text())["load_workers"]
        == summary["load_workers"]
    )
    assert pd.read_parquet(run_dir / "requests.parquet").equals(requests)


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
