"""CPU placement: CPU lists, the plan from ``[placement]``, processes started on their set (and
what they fork inheriting it), the harness's own thread on the load set, and a run that records
what it did."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest
from pydantic import ValidationError

from harness import ScenarioError, parse_scenario, run_scenario
from harness.analysis._saturation import saturation_summary
from harness.lifecycle._placement import pinned_to_load, plan_placement
from harness.scenario import PlacementConfig
from harness.servers._process import start_process, stop_process_group
from zwcore import format_cpu_list, parse_cpu_list

CPUS = tuple(sorted(os.sched_getaffinity(0)))
two_cpus = pytest.mark.skipif(len(CPUS) < 2, reason="needs 2 usable CPUs")


def test_cpu_lists_read_and_write_the_kernel_format():
    assert parse_cpu_list("0,2,4-7") == (0, 2, 4, 5, 6, 7)
    assert parse_cpu_list(" 3 , 1-1,3") == (1, 3)
    assert format_cpu_list((0, 1, 2, 5, 7, 8)) == "0-2,5,7-8"
    for bad in ("", "a", "3-1", "-1", "1-"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)
    with pytest.raises(ValueError, match="CPU numbers go up to 8191"):
        parse_cpu_list("0-9999999999")  # refused before a set of that size is built


def test_plan_splits_sets_or_says_why_not():
    auto = plan_placement(PlacementConfig(), available=(0, 1, 2))
    assert (auto.target_cpus, auto.load_cpus) == ((0, 1), (2,))
    one = plan_placement(PlacementConfig(), available=(3,))
    assert not one.applied and one.reason == "impossible: 1 usable CPU"
    off = plan_placement(PlacementConfig(enabled=False), available=(0, 1))
    assert not off.applied and "enabled = false" in off.reason
    url = plan_placement(PlacementConfig(), available=(0, 1), target_started=False)
    assert not url.applied and url.reason == "none: the run does not start the target"
    only = plan_placement(PlacementConfig(load_cpus="1"), available=(0, 1), target_started=False)
    assert not only.applied and only.load_cpus == (1,) and "load only" in only.reason
    given = plan_placement(PlacementConfig(load_cpus="3"), available=(0, 1, 2, 3))
    assert (given.target_cpus, given.load_cpus) == ((0, 1, 2), (3,))
    assert given.describe() == {
        "applied": True, "target_cpus": "0-2", "load_cpus": "3", "available_cpus": "0-3",
        "reason": "set in [placement]",
    }  # fmt: skip
    with pytest.raises(ScenarioError, match=r"placement.target_cpus: CPU 7 is not usable here"):
        plan_placement(PlacementConfig(target_cpus="0,7"), available=(0, 1))
    with pytest.raises(ScenarioError, match="placement.load_cpus: no usable CPU is left"):
        plan_placement(PlacementConfig(target_cpus="0-1"), available=(0, 1))


def test_bad_placement_is_located_in_the_scenario(tmp_path):
    text = (
        'name = "p"\n[target]\nkind = "sim"\n[[groups]]\nname = "g"\nusers = 1\n'
        '[placement]\ntarget_cpus = "0-1"\nload_cpus = "1"\n'
    )
    with pytest.raises(ScenarioError, match=r"p.toml:7.*overlap on CPU 1"):
        parse_scenario(text, path=tmp_path / "p.toml")
    with pytest.raises(ValidationError, match="need enabled = true"):
        PlacementConfig(enabled=False, target_cpus="0")
    with pytest.raises(ValidationError, match="enabled"):
        PlacementConfig(enabled="no")  # type: ignore[arg-type]


@two_cpus
def test_a_server_and_what_it_forks_run_on_its_set(tmp_path):
    # the shell forks a sleeping child after it started: the child must inherit the set
    proc = start_process(
        ["sh", "-c", "sleep 30 & echo $! > child; wait"],
        log_path=tmp_path / "log",
        cwd=tmp_path,
        cpus=(CPUS[0],),
    )
    try:
        deadline = time.monotonic() + 10
        pid_file = tmp_path / "child"
        while time.monotonic() < deadline and not (
            pid_file.exists() and pid_file.read_text().endswith("\n")
        ):  # the shell may not have finished writing it
            time.sleep(0.05)
        child = int((tmp_path / "child").read_text())
        assert os.sched_getaffinity(proc.pid) == {CPUS[0]}
        assert os.sched_getaffinity(child) == {CPUS[0]}
    finally:
        stop_process_group(proc, grace_s=2)


@two_cpus
def test_the_harness_starts_the_load_on_the_load_set_and_gets_its_set_back():
    before = os.sched_getaffinity(0)
    placement = plan_placement(PlacementConfig(), available=CPUS)
    idle = threading.Event()
    earlier = threading.Thread(target=idle.wait, daemon=True)  # a thread started before the run
    earlier.start()
    with pinned_to_load(placement):
        assert os.sched_getaffinity(0) == set(placement.load_cpus or ())
        assert os.sched_getaffinity(earlier.native_id) == set(placement.load_cpus or ())
        child = subprocess.run(
            ["python3", "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    assert json.loads(child.stdout) == list(placement.load_cpus or ())
    assert os.sched_getaffinity(0) == before
    assert os.sched_getaffinity(earlier.native_id) == before
    idle.set()


def test_a_saturated_client_without_placement_is_told_why(tmp_path):
    path = tmp_path / "saturation-g.jsonl"
    path.write_text(
        "".join(
            json.dumps({"t": i, "pid": 1, "cpu_pct": 99.0, "loop_lag_ms": 20.0}) + "\n"
            for i in range(20)
        )
    )
    off = {"applied": False, "reason": "impossible: 1 usable CPU"}
    message = saturation_summary([path], placement=off).message
    assert message.startswith("client saturated") and message.endswith(
        "; no CPU placement: impossible: 1 usable CPU"
    )
    assert "placement" not in saturation_summary([path], placement={"applied": True}).message


SCENARIO = """
name = "placed"
max_duration_s = 60
cooldown_s = 0.5

[target]
kind = "sim"

[[groups]]
name = "fast"
users = 2
requests_per_user = 2
prompt_tokens = 16
max_tokens = 32
"""


@two_cpus
def test_a_run_records_its_placement(tmp_path):
    result = run_scenario(parse_scenario(SCENARIO, path=tmp_path / "s.toml"), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    placement = json.loads((result.run_dir / "run.json").read_text())["placement"]
    half = (len(CPUS) + 1) // 2
    assert placement["applied"] is True
    assert placement["target_cpus"] == format_cpu_list(CPUS[:half])
    assert placement["load_cpus"] == format_cpu_list(CPUS[half:])
