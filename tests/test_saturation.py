"""Client-saturation guard: the summary of sample files, and real Locust processes sampling
themselves, one lightly loaded and one that burns its CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.analysis._saturation import saturation_summary
from loadgen import Paced, UserGroupConfig
from tests.test_loadgen import REPO, Script, StreamServer, run_locust


def write_samples(path: Path, rows: list[tuple[float, float]], *, pid: int = 100) -> Path:
    with path.open("a") as f:
        for i, (cpu, lag) in enumerate(rows):
            f.write(json.dumps({"t": 10 + 0.5 * i, "pid": pid, "cpu_pct": cpu, "loop_lag_ms": lag}))
            f.write("\n")
    return path


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


# --- the summary ------------------------------------------------------------------------------


def test_quiet_process_is_not_saturated(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "saturation-victims.jsonl", [(20.0, 0.5)] * 9 + [(95.0, 9.0)])
    s = saturation_summary([path])
    assert not s.saturated and s.message == "client not saturated"
    [p] = s.processes
    assert (p.group, p.pid, p.samples) == ("victims", 100, 10)
    assert p.over_cpu_fraction == p.over_lag_fraction == p.over_any_fraction == 0.1  # not > 10 %
    assert p.cpu_p50_pct == 20.0 and p.cpu_max_pct == 95.0
    assert p.loop_lag_p50_ms == 0.5 and p.loop_lag_max_ms == 9.0
    assert p.span_s == pytest.approx(4.5)


def test_busy_cpu_flags_the_group(tmp_path: Path) -> None:
    quiet = write_samples(tmp_path / "saturation-victims.jsonl", [(20.0, 0.5)] * 10)
    busy = [(93.0, 1.0)] * 13 + [(50.0, 1.0)]
    path = write_samples(tmp_path / "saturation-aggressors.jsonl", busy)
    s = saturation_summary([quiet, path])
    assert s.saturated
    assert [p.saturated for p in s.processes] == [False, True]
    assert s.message == (
        "client saturated: latency figures unreliable "
        "(group aggressors: 93 % of samples above 85 % CPU)"
    )


def test_loop_lag_alone_flags_and_either_limit_counts(tmp_path: Path) -> None:
    # 6 % over the CPU limit and 6 % over the lag limit, in different samples: 12 % over either.
    rows = [(10.0, 1.0)] * 44 + [(90.0, 1.0)] * 3 + [(10.0, 8.0)] * 3
    s = saturation_summary([write_samples(tmp_path / "saturation-g.jsonl", rows)])
    assert s.saturated
    assert s.processes[0].over_any_fraction == pytest.approx(0.12)
    assert s.message.endswith(
        "(group g: 6 % of samples above 85 % CPU and 6 % above 5 ms loop lag)"
    )
    lag_only = write_samples(tmp_path / "saturation-h.jsonl", [(10.0, 12.0)] * 5)
    assert saturation_summary([lag_only]).message.endswith(
        "(group h: 100 % of samples above 5 ms loop lag)"
    )
    # Custom limits.
    assert not saturation_summary([lag_only], lag_limit_ms=20.0).saturated


def test_processes_sharing_a_file_are_told_apart(tmp_path: Path) -> None:
    path = tmp_path / "saturation-g.jsonl"
    write_samples(path, [(10.0, 1.0)] * 4, pid=1)
    write_samples(path, [(99.0, 1.0)] * 4, pid=2)
    s = saturation_summary([path])
    assert [(p.pid, p.saturated) for p in s.processes] == [(1, False), (2, True)]
    assert "(group g pid 2: 100 % of samples above 85 % CPU)" in s.message


def test_nothing_sampled(tmp_path: Path) -> None:
    empty = tmp_path / "saturation-a.jsonl"
    empty.write_text("")
    s = saturation_summary([empty, tmp_path / "saturation-missing.jsonl"])
    assert not s.saturated and s.processes == []
    assert s.message == "client saturation unknown: nothing was sampled"
    assert len(s.unsampled) == 2
    assert saturation_summary([]).message == s.message


def test_partial_sampling_and_bad_lines(tmp_path: Path) -> None:
    path = write_samples(tmp_path / "saturation-a.jsonl", [(10.0, 1.0)] * 3)
    with path.open("a") as f:
        f.write('{"t": 1, "pid": 100}\nnot json\n{"t": 12, "pid": 100, "cpu_')  # cut last line
    s = saturation_summary([path, tmp_path / "saturation-b.jsonl"])
    assert s.processes[0].samples == 3
    assert s.message == "client not saturated (no samples from: b)"
    with pytest.raises(ValueError):
        saturation_summary([path], max_fraction=1.0)


# --- real Locust processes --------------------------------------------------------------------


@pytest.fixture
def server() -> Iterator[StreamServer]:
    s = StreamServer(Script(delay_s=0.02))
    yield s
    s.close()


def test_locustfile_samples_a_light_run(
    server: StreamServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "run" / "saturation-light.jsonl"
    monkeypatch.setenv("ZW_SATURATION", str(path))
    group = UserGroupConfig(
        name="light", users=2, requests_per_user=6, max_tokens=60, timeout_s=20,
        read=Paced(bytes_per_read=512, interval_s=0.01),
    )  # fmt: skip
    # About 7.5 s of streaming: enough samples that the one lag spike at spawn stays under the
    # guard's 10 % (with 2.5 s it was 1 of 5 samples, and the light run read as saturated).
    proc, got, elapsed = run_locust(tmp_path, group, server.url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(got) == 12 and {r.outcome for r in got} == {"complete"}
    lines = read_lines(path)
    assert len(lines) >= 3
    assert len({line["pid"] for line in lines}) == 1 and lines[0]["pid"] != os.getpid()
    gaps = [b["t"] - a["t"] for a, b in zip(lines, lines[1:], strict=False)]
    assert all(0.35 < g < 0.75 for g in gaps), gaps  # 0.5 s * (0.8..1.2), plus lag
    assert all(0 <= line["cpu_pct"] < 85 for line in lines), lines
    assert all(0 <= line["loop_lag_ms"] < 50 for line in lines), lines
    s = saturation_summary([path])
    assert not s.saturated, s.message
    assert s.processes[0].cpu_p50_pct < 50 and s.processes[0].loop_lag_p50_ms < 5


def test_locustfile_without_the_variable_samples_nothing(
    server: StreamServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ZW_SATURATION", raising=False)
    group = UserGroupConfig(name="plain", users=1, requests_per_user=1, max_tokens=4)
    proc, got, _ = run_locust(tmp_path, group, server.url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(got) == 1
    assert not list(tmp_path.rglob("saturation*"))


BURNING_LOCUSTFILE = """
import os
import time

import gevent
from locust import User, constant, events, task

from loadgen._saturation import sample_saturation


class Burner(User):
    wait_time = constant(0)

    @task
    def burn(self):
        end = time.perf_counter() + 0.02  # 20 ms of CPU without yielding, then a 1 ms sleep
        while time.perf_counter() < end:
            pass
        gevent.sleep(0.001)


@events.init.add_listener
def _sample(environment, **_kwargs):
    sample_saturation(environment, path=os.environ["ZW_SATURATION"], interval_s=0.25)
"""


def test_overloaded_load_process_is_flagged(tmp_path: Path) -> None:
    locustfile = tmp_path / "burner.py"
    locustfile.write_text(BURNING_LOCUSTFILE)
    path = tmp_path / "saturation-burner.jsonl"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "1", "-r", "1",
        "--run-time", "3s", "--only-summary", "--loglevel", "WARNING",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "ZW_SATURATION": str(path)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 20
    s = saturation_summary([path])
    [p] = s.processes
    assert p.samples >= 4  # every 0.5 s for 3 s; a starved sampler misses some
    assert s.saturated and s.message.startswith(
        "client saturated: latency figures unreliable (group burner: "
    )
    # A busy loop that never yields: above the CPU limit or the lag limit most of the time (on a
    # shared 2-core machine the scheduler can hold its CPU share under 85 %; the lag shows then).
    assert p.over_any_fraction > 0.5
    assert p.cpu_p50_pct > 50 and p.loop_lag_max_ms > 5
