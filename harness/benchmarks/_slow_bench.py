"""Slow-reader capacity of one load process: how many slow streams one Locust process running
the toolkit's locustfile holds open against the bench SSE server, and what they cost it (CPU
over a measuring window, RSS, the gevent hub's loop lag, each stream's read rate)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.benchmarks._bench_server import SseServer
from harness.benchmarks._common import Children, percentile, proc_cpu_s
from harness.benchmarks._locust_load import (
    RECORDS,
    SATURATION,
    locust_command,
    log_tail,
    loop_lag_p99,
    write_group_config,
)

_SPAWN_RATE = 1000  # users started per second
_STALL_S = 15.0  # the ramp is over when the count of open streams has not risen for this long
_SETTLE_S = 2.0  # after the ramp, before measuring: the last readers settle into their pace


@dataclass
class SlowResult:
    """Slow-reader capacity: streams held open by one load process and what they cost it."""

    target_streams: int
    streams_open: int  # server-side streams open during the measuring window (minimum)
    cpu_pct: float  # load process CPU over the window, % of one core
    rss_mib: float
    loop_lag_p99_ms: float  # gevent hub lag, samples within the window
    read_rate_p50_bytes_per_s: float  # per stream: bytes_received / (last byte - first byte)
    window_s: float
    ramp_s: float  # from starting the load process until every stream was open


@dataclass
class _Window:
    """What the measuring window saw: the server's open-stream counts, every 0.5 s, and the
    load process's CPU (s) and RSS (MiB) over it, from ``t0`` to ``t1`` (monotonic s)."""

    opened: list[int]
    cpu_s: float
    t0: float
    t1: float
    rss_mib: float


def run_slow(
    *, streams: int, bytes_per_s: int = 64, rcvbuf: int = 4096, window_s: float = 15.0
) -> SlowResult:
    """Hold ``streams`` slow readers (``bytes_per_s`` per stream in one ``recv`` per second,
    ``SO_RCVBUF=rcvbuf``) in one Locust process; measure its CPU over ``window_s`` seconds once
    every stream is open (or the count stopped rising)."""
    workdir = Path(tempfile.mkdtemp(prefix="zw-bench-slow-"))
    try:
        with Children() as children:
            server = SseServer(children, events=1_000_000, interval_ms=1000)
            read = {"kind": "paced", "bytes_per_read": bytes_per_s, "interval_s": 1.0}
            write_group_config(
                workdir / "group.json", port=server.port, streams=streams, events=1_000_000,
                read=read, rcvbuf=rcvbuf,
            )  # fmt: skip
            ramp_s = streams / _SPAWN_RATE
            run_time = int(ramp_s + window_s + 140)
            argv, env = locust_command(
                workdir, users=streams, spawn_rate=_SPAWN_RATE, run_time_s=run_time
            )
            with open(workdir / "locust.log", "wb") as log:
                proc = children.start(
                    argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
                )
            ramp_done_s = _wait_until_open(server, proc, streams, ramp_s)
            time.sleep(_SETTLE_S)
            window = _measure(server, proc, window_s)
            # Locust stops its users on SIGTERM: every stream is recorded as interrupted.
            Children.stop(proc, grace_s=120)
        rates = _read_rates(workdir / RECORDS)
        if min(window.opened, default=0) < streams:  # say why, from the load process's own log
            print(
                "slow readers: not every stream opened; Locust log ends:\n"
                + log_tail(workdir / "locust.log"),
                file=sys.stderr,
            )
        return SlowResult(
            target_streams=streams,
            streams_open=min(window.opened) if window.opened else 0,
            cpu_pct=100.0 * window.cpu_s / (window.t1 - window.t0),
            rss_mib=window.rss_mib,
            loop_lag_p99_ms=loop_lag_p99(workdir / SATURATION, (window.t0, window.t1)),
            read_rate_p50_bytes_per_s=percentile(rates, 50),
            window_s=window.t1 - window.t0,
            ramp_s=ramp_done_s,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _wait_until_open(
    server: SseServer, proc: subprocess.Popen[Any], streams: int, ramp_s: float
) -> float:
    """Wait until every stream is open, the count has not risen for :data:`_STALL_S`, the load
    process ended, or ``ramp_s`` + 90 s passed; return the seconds waited."""
    best, best_at, t0 = 0, time.monotonic(), time.monotonic()
    while time.monotonic() - t0 < ramp_s + 90:
        time.sleep(0.5)
        n = int(server.latest()["open"])
        if n > best:
            best, best_at = n, time.monotonic()
        if n >= streams or time.monotonic() - best_at > _STALL_S or proc.poll() is not None:
            break
    return time.monotonic() - t0


def _measure(server: SseServer, proc: subprocess.Popen[Any], window_s: float) -> _Window:
    """The open-stream counts and the load process's CPU over ``window_s`` s, then its RSS."""
    opened = []
    c0, w0 = proc_cpu_s(proc.pid), time.monotonic()
    while time.monotonic() - w0 < window_s:
        time.sleep(0.5)
        opened.append(int(server.latest()["open"]))
    c1, w1 = proc_cpu_s(proc.pid), time.monotonic()
    return _Window(opened=opened, cpu_s=c1 - c0, t0=w0, t1=w1, rss_mib=_rss_mib(proc.pid))


def _read_rates(records: Path) -> list[float]:
    """Each recorded stream's read rate (bytes/s from its first to its last byte), of the
    streams that read for more than 5 s."""
    rates = []
    if records.exists():
        for line in records.read_text().splitlines():
            r = json.loads(line)
            first, last = r.get("t_first_byte"), r.get("t_last_byte")
            if first and last and last - first > 5:
                rates.append(r["bytes_received"] / (last - first))
    return rates


def _rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` (MiB, ``VmRSS``); NaN when it cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan
