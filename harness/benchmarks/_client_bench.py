"""The client benchmark's measurement: how many events per second a load client parses and
timestamps on one SSE workload, what each event costs it in CPU, and how exact its ITL is.

The server is the bench SSE server (:mod:`harness.benchmarks._sse_server`, pinned to one CPU),
which stamps each chunk with its CLOCK_MONOTONIC emission time; the client (pinned to another)
is one real Locust process running the toolkit's locustfile and user classes
(:mod:`harness.benchmarks._locust_load`), as ``zerowindow run`` starts a group, or vLLM's
benchmark request function (:mod:`harness.benchmarks._vllm_client`) on the same workload.

ITL error: for every pair of consecutive chunks of a stream, the gap the client measured minus
the gap between the server's emission times, in ms (absolute value; p50, p99). Delivery delay:
client timestamp minus emission time (both CLOCK_MONOTONIC of this machine). Client CPU: the
client process's utime + stime, sampled every 20 ms, over the window from its first to its
last chunk.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.benchmarks._bench_server import SseServer, bench_cpus
from harness.benchmarks._common import (
    BenchError,
    Children,
    CpuTrace,
    module_argv,
    percentile,
    pin_argv,
    us_per_event,
)
from harness.benchmarks._locust_load import RECORDS, last_line, locust_command, write_group_config

CLIENTS = ("zerowindow", "zerowindow-read", "vllm")
"""``zerowindow``: the toolkit's client as a run uses it (full-speed reads stamped with the
kernel's arrival time); ``zerowindow-read``: the same with ``timestamps = "read"`` (each read
stamped when ``recv`` returned, as vLLM's client does); ``vllm``: vLLM's benchmark client."""


@dataclass
class ItlResult:
    """Consumption, CPU and ITL accuracy of one client on one workload."""

    client: str  # one of CLIENTS
    streams: int
    interval_ms: float  # server's gap between a stream's chunks (0: as fast as possible)
    offered_events_per_s: float  # streams * 1000 / interval (inf for 0)
    events: int  # chunks the client recorded
    events_per_s: float
    itl_err_p50_ms: float
    itl_err_p99_ms: float
    delay_p50_ms: float
    delay_p99_ms: float
    cpu_pct: float  # client process, % of one core from its first to its last chunk
    cpu_us_per_event: float  # client CPU over that window / events
    server_cpu_pct: float  # the bench SSE server over the same window (100: it was the limit)
    failed: int


def _figures(streams: list[tuple[list[float], list[int]]]) -> dict[str, float]:
    """ITL error and delay over every chunk; events/s over the window in which every stream
    was streaming (from the last stream's first chunk to the first stream's last chunk), so
    that staggered starts and ends do not dilute the rate."""
    errors: list[float] = []
    delays: list[float] = []
    first, last, count = math.inf, -math.inf, 0
    for t, emit_ns in streams:
        if not t:
            continue
        first, last, count = min(first, t[0]), max(last, t[-1]), count + len(t)
        e = [ns / 1e9 for ns in emit_ns]
        delays += [(a - b) * 1000 for a, b in zip(t, e, strict=True)]
        for i in range(1, len(t)):
            errors.append(abs((t[i] - t[i - 1]) - (e[i] - e[i - 1])) * 1000)
    live = [t for t, _ in streams if t]
    start = max((t[0] for t in live), default=math.nan)
    end = min((t[-1] for t in live), default=math.nan)
    if end - start > 1.0:
        # k events of one stream inside the window span k - 1 gaps of it
        gaps = sum(sum(1 for x in t if start <= x <= end) - 1 for t in live)
        rate = gaps / (end - start)
    else:  # no common window worth the name: the whole span
        rate = (count - 1) / (last - first) if count > 1 and last > first else math.nan
    return {
        "events": count,
        "events_per_s": rate,
        "first": first,
        "last": last,
        "itl_err_p50_ms": percentile(errors, 50),
        "itl_err_p99_ms": percentile(errors, 99),
        "delay_p50_ms": percentile(delays, 50),
        "delay_p99_ms": percentile(delays, 99),
    }


def _run_ours(
    children: Children, workdir: Path, port: int, streams: int, events: int, *, timestamps: str
) -> tuple[list[tuple[list[float], list[int]]], int, CpuTrace]:
    write_group_config(
        workdir / "group.json", port=port, streams=streams, events=events,
        read={"kind": "full_speed"}, rcvbuf=None, timestamps=timestamps,
    )  # fmt: skip
    argv, env = locust_command(workdir, users=streams, spawn_rate=streams, run_time_s=600)
    with open(workdir / "locust.log", "wb") as log:
        proc = children.start(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    trace = CpuTrace(proc.pid)
    code = children.wait(proc, 900)
    trace.stop()
    if code != 0:
        raise BenchError(f"Locust exited with code {code}: {last_line(workdir / 'locust.log')}")
    per_stream, failed = [], 0
    records = workdir / RECORDS
    if not records.exists():
        raise BenchError(f"Locust wrote no records: {last_line(workdir / 'locust.log')}")
    try:
        for line in records.read_text().splitlines():
            r = json.loads(line)
            failed += r["outcome"] != "complete"
            chunks = [c for c in r["chunks"] if c["text"].strip()]
            per_stream.append(([c["t"] for c in chunks], [int(c["text"]) for c in chunks]))
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"cannot read the client's records ({records.name}): {exc!r}") from None
    return per_stream, failed, trace


def _run_vllm(
    children: Children, workdir: Path, port: int, streams: int, events: int
) -> tuple[list[tuple[list[float], list[int]]], int, CpuTrace]:
    out = workdir / "vllm.json"
    argv = [
        *pin_argv(bench_cpus()[1]),
        *module_argv(
            "harness.benchmarks._vllm_client", "--url", f"http://127.0.0.1:{port}/v1/completions",
            "--streams", str(streams), "--events", str(events), "--out", str(out),
        ),
    ]  # fmt: skip
    with open(workdir / "vllm.log", "wb") as log:
        proc = children.start(argv, stdout=log, stderr=subprocess.STDOUT)
    trace = CpuTrace(proc.pid)
    code = children.wait(proc, 900)
    trace.stop()
    if code != 0 or not out.exists():
        raise BenchError(
            f"vLLM's client exited with code {code}: {last_line(workdir / 'vllm.log')}"
        )
    per_stream, failed = [], 0
    try:
        for r in json.loads(out.read_text())["requests"]:
            failed += not r["success"]
            t = [r["start_time"] + r["ttft"]]
            for gap in r["itl"]:
                t.append(t[-1] + gap)
            emit = [int(x) for x in r["generated_text"].split()]
            n = min(len(t), len(emit))
            per_stream.append((t[:n], emit[:n]))
    except (ValueError, KeyError, TypeError) as exc:
        raise BenchError(f"cannot read vLLM's client's output: {exc!r}") from None
    return per_stream, failed, trace


def run_itl(*, client: str, streams: int, interval_ms: float, events: int) -> ItlResult:
    """Stream ``events`` chunks on each of ``streams`` concurrent requests, one every
    ``interval_ms`` (0: as fast as possible), read by ``client`` (``zerowindow`` and
    ``zerowindow-read``: one Locust process with the toolkit's locustfile, kernel or read
    stamps; ``vllm``: vLLM's benchmark request function), and
    measure the client. Raises :class:`BenchError` when the client fails."""
    if client not in CLIENTS:
        raise BenchError(f"unknown client {client!r}: one of {', '.join(CLIENTS)}")
    workdir = Path(tempfile.mkdtemp(prefix="zw-bench-itl-"))
    try:
        with Children() as children:
            server = SseServer(children, events=events, interval_ms=interval_ms)
            server_trace = CpuTrace(server.proc.pid, period_s=0.05)
            args = (children, workdir, server.port, streams, events)
            if client == "vllm":
                per_stream, failed, trace = _run_vllm(*args)
            else:
                stamps = "read" if client == "zerowindow-read" else "kernel"
                per_stream, failed, trace = _run_ours(*args, timestamps=stamps)
            server_trace.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    f = _figures(per_stream)
    span = f["last"] - f["first"]
    cpu_s = trace.between(f["first"], f["last"])
    return ItlResult(
        client=client,
        streams=streams,
        interval_ms=interval_ms,
        offered_events_per_s=streams * 1000.0 / interval_ms if interval_ms else math.inf,
        events=int(f["events"]),
        events_per_s=f["events_per_s"],
        itl_err_p50_ms=f["itl_err_p50_ms"],
        itl_err_p99_ms=f["itl_err_p99_ms"],
        delay_p50_ms=f["delay_p50_ms"],
        delay_p99_ms=f["delay_p99_ms"],
        cpu_pct=100.0 * cpu_s / span if span > 0 else math.nan,
        cpu_us_per_event=us_per_event(cpu_s, int(f["events"])),
        server_cpu_pct=100.0 * server_trace.between(f["first"], f["last"]) / span
        if span > 0
        else math.nan,
        failed=failed,
    )
