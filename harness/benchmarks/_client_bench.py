"""Benchmarks of a load client on one SSE workload: how many events per second it parses and
timestamps, what each event costs it in CPU, how exact its ITL is, and how many slow streams
one load process holds.

The server is the bench SSE server (:mod:`harness.benchmarks._sse_server`, pinned to one CPU),
which stamps each chunk with its CLOCK_MONOTONIC emission time; the client (pinned to another)
is one real Locust process running the toolkit's locustfile and user classes (``python -m
locust -f loadgen/locustfile.py --zw-group-config ...``), as ``zerowindow run`` starts a
group, or vLLM's benchmark request function (:mod:`harness.benchmarks._vllm_client`) on the
same workload.

ITL error: for every pair of consecutive chunks of a stream, the gap the client measured minus
the gap between the server's emission times, in ms (absolute value; p50, p99). Delivery delay:
client timestamp minus emission time (both CLOCK_MONOTONIC of this machine). Client CPU: the
client process's utime + stime, sampled every 20 ms, over the window from its first to its
last chunk.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
from harness.benchmarks._common import (
    BenchError,
    Children,
    CpuTrace,
    module_argv,
    percentile,
    pin_argv,
    placement,
    proc_cpu_s,
    raise_nofile,
)

LOCUSTFILE = Path(loadgen.__file__).with_name("locustfile.py")
CLIENTS = ("zerowindow", "zerowindow-read", "vllm")
"""``zerowindow``: the toolkit's client as a run uses it (full-speed reads stamped with the
kernel's arrival time); ``zerowindow-read``: the same with ``timestamps = "read"`` (each read
stamped when ``recv`` returned, as vLLM's client does); ``vllm``: vLLM's benchmark client."""


def _cpus() -> tuple[int | None, int | None]:
    """(server CPU, client CPU), or (None, None) on a machine with one CPU."""
    pair = placement()
    return pair if pair is not None else (None, None)


class SseServer:
    """The bench SSE server as a child process of ``children``, its stats lines collected by a
    thread."""

    def __init__(
        self, children: Children, *, events: int, interval_ms: float, loop: str = "asyncio"
    ) -> None:
        raise_nofile()
        argv = [
            *pin_argv(_cpus()[0]),
            *module_argv(
                "harness.benchmarks._sse_server", "--port", "0", "--events", str(events),
                "--interval-ms", str(interval_ms), "--loop", loop, "--stats-interval-s", "0.5",
            ),
        ]  # fmt: skip
        self.proc = children.start(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            self.port = int(json.loads(line)["listening"])
        except (ValueError, KeyError):
            raise BenchError(f"the bench SSE server did not start: {line.strip()!r}") from None
        self.stats: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                try:
                    self.stats.append(json.loads(line))
                except ValueError:
                    pass
        except (OSError, ValueError):  # closed by Children.stop
            pass

    def latest(self) -> dict[str, Any]:
        return self.stats[-1] if self.stats else {"open": 0, "events": 0}


def _group_config(
    path: Path, *, port: int, streams: int, events: int, read: dict[str, Any],
    rcvbuf: int | None, timestamps: str = "kernel", arrival: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    loop: dict[str, Any] = (
        {"arrival": arrival} if arrival else {"users": streams, "requests_per_user": 1}
    )
    config = {
        "group": {
            "name": "bench", **loop, "prompt_tokens": 1,
            "max_tokens": events, "timeout_s": 3600, "read": read, "rcvbuf_bytes": rcvbuf,
            "timestamps": timestamps,
        },
        "host": f"http://127.0.0.1:{port}",
        "model": "bench",
        "records_path": str(path.parent / "records-bench.jsonl"),
        "seed": 0,
    }  # fmt: skip
    path.write_text(json.dumps(config))


def _locust(
    workdir: Path, *, users: int, spawn_rate: int, run_time_s: int
) -> tuple[list[str], dict[str, str]]:
    """One Locust process running the toolkit's locustfile, as ``zerowindow run`` starts a
    group (saturation sampler included)."""
    argv = [
        *pin_argv(_cpus()[1]), sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
        "--headless", "-u", str(users), "-r", str(spawn_rate), "--run-time", f"{run_time_s}s",
        "--stop-timeout", "0", "--only-summary", "--loglevel", "WARNING",
        "--zw-group-config", str(workdir / "group.json"),
    ]  # fmt: skip
    env = {**os.environ, "ZW_SATURATION": str(workdir / "saturation-bench.jsonl")}
    return argv, env


def _rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return math.nan


def _lag_p99(path: Path, window: tuple[float, float]) -> float:
    """The gevent hub's loop lag p99 (ms) of the sampler's samples taken within ``window``."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return percentile([r["loop_lag_ms"] for r in rows if window[0] <= r["t"] <= window[1]], 99)


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def _last_line(path: Path) -> str:
    """The last non-empty line of a log (what a failed program said last)."""
    lines = [line.strip() for line in _tail(path, 4000).splitlines() if line.strip()]
    return lines[-1] if lines else f"nothing in {path.name}"


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
            _group_config(
                workdir / "group.json", port=server.port, streams=streams, events=1_000_000,
                read=read, rcvbuf=rcvbuf,
            )  # fmt: skip
            spawn_rate = 1000
            ramp_s = streams / spawn_rate
            run_time = int(ramp_s + window_s + 140)
            argv, env = _locust(workdir, users=streams, spawn_rate=spawn_rate, run_time_s=run_time)
            with open(workdir / "locust.log", "wb") as log:
                proc = children.start(
                    argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
                )
            # Wait until every stream is open, or the count has not risen for 15 s.
            best, best_at, t0 = 0, time.monotonic(), time.monotonic()
            while time.monotonic() - t0 < ramp_s + 90:
                time.sleep(0.5)
                n = int(server.latest()["open"])
                if n > best:
                    best, best_at = n, time.monotonic()
                if n >= streams or time.monotonic() - best_at > 15 or proc.poll() is not None:
                    break
            ramp_done_s = time.monotonic() - t0
            time.sleep(2.0)  # let the last readers settle into their pace
            opened = []
            c0, w0 = proc_cpu_s(proc.pid), time.monotonic()
            while time.monotonic() - w0 < window_s:
                time.sleep(0.5)
                opened.append(int(server.latest()["open"]))
            c1, w1 = proc_cpu_s(proc.pid), time.monotonic()
            rss = _rss_mib(proc.pid)
            # Locust stops its users on SIGTERM: every stream is recorded as interrupted.
            Children.stop(proc, grace_s=120)
        rates = []
        records = workdir / "records-bench.jsonl"
        if records.exists():
            for line in records.read_text().splitlines():
                r = json.loads(line)
                first, last = r.get("t_first_byte"), r.get("t_last_byte")
                if first and last and last - first > 5:
                    rates.append(r["bytes_received"] / (last - first))
        if min(opened, default=0) < streams:  # say why, from the load process's own log
            print(
                "slow readers: not every stream opened; Locust log ends:\n"
                + _tail(workdir / "locust.log"),
                file=sys.stderr,
            )
        return SlowResult(
            target_streams=streams,
            streams_open=min(opened) if opened else 0,
            cpu_pct=100.0 * (c1 - c0) / (w1 - w0),
            rss_mib=rss,
            loop_lag_p99_ms=_lag_p99(workdir / "saturation-bench.jsonl", (w0, w1)),
            read_rate_p50_bytes_per_s=percentile(rates, 50),
            window_s=w1 - w0,
            ramp_s=ramp_done_s,
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@dataclass
class SendLagResult:
    """How close one load process keeps an open-loop schedule: the send lag
    (``t_send - t_scheduled``, ms) over every request, and the rate it sent at."""

    rate_rps: float
    requests: int
    sent_rps: float
    send_lag_p50_ms: float
    send_lag_p99_ms: float
    send_lag_max_ms: float
    loop_lag_p99_ms: float
    command: str


def run_send_lag(
    *, rate_rps: float = 50.0, duration_s: float = 30.0, events: int = 20, interval_ms: float = 10
) -> SendLagResult:
    """Send a Poisson schedule of ``rate_rps`` requests/s for ``duration_s`` from one Locust
    process (the toolkit's locustfile, pinned to the client CPU) to the bench SSE server (the
    other CPU), each answered with ``events`` chunks ``interval_ms`` apart, and measure how late
    each request left against its deadline. Raises :class:`BenchError` if no record came."""
    workdir = Path(tempfile.mkdtemp(prefix="zw-bench-send-lag-"))
    arrival = {"kind": "poisson", "rate_rps": rate_rps, "duration_s": duration_s}
    try:
        with Children() as children:
            server = SseServer(children, events=events, interval_ms=interval_ms)
            _group_config(
                workdir / "group.json", port=server.port, streams=1, events=events,
                read={"kind": "full_speed"}, rcvbuf=None, arrival=arrival,
            )  # fmt: skip
            argv, env = _locust(workdir, users=1, spawn_rate=1, run_time_s=int(duration_s + 60))
            with open(workdir / "locust.log", "wb") as log:
                proc = children.start(
                    argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
                )
            children.wait(proc, timeout_s=duration_s + 90)
        path = workdir / "records-bench.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines]
        if not records:
            raise BenchError(f"Locust wrote no records: {_last_line(workdir / 'locust.log')}")
        lags = [(r["t_send"] - r["t_scheduled"]) * 1000.0 for r in records]
        sends = sorted(r["t_send"] for r in records)
        window = (sends[0], sends[-1])
        return SendLagResult(
            rate_rps=rate_rps,
            requests=len(records),
            sent_rps=(len(sends) - 1) / (window[1] - window[0]) if len(sends) > 1 else math.nan,
            send_lag_p50_ms=percentile(lags, 50),
            send_lag_p99_ms=percentile(lags, 99),
            send_lag_max_ms=max(lags),
            loop_lag_p99_ms=_lag_p99(workdir / "saturation-bench.jsonl", window),
            command=(
                f"python bench/run.py --only openloop  # Poisson {rate_rps:g} requests/s for "
                f"{duration_s:g} s, {events} chunks {interval_ms:g} ms apart each"
            ),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
    _group_config(
        workdir / "group.json", port=port, streams=streams, events=events,
        read={"kind": "full_speed"}, rcvbuf=None, timestamps=timestamps,
    )  # fmt: skip
    argv, env = _locust(workdir, users=streams, spawn_rate=streams, run_time_s=600)
    with open(workdir / "locust.log", "wb") as log:
        proc = children.start(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    trace = CpuTrace(proc.pid)
    code = children.wait(proc, 900)
    trace.stop()
    if code != 0:
        raise BenchError(f"Locust exited with code {code}: {_last_line(workdir / 'locust.log')}")
    per_stream, failed = [], 0
    records = workdir / "records-bench.jsonl"
    if not records.exists():
        raise BenchError(f"Locust wrote no records: {_last_line(workdir / 'locust.log')}")
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
        *pin_argv(_cpus()[1]),
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
            f"vLLM's client exited with code {code}: {_last_line(workdir / 'vllm.log')}"
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
        cpu_us_per_event=cpu_s / f["events"] * 1e6 if f["events"] else math.nan,
        server_cpu_pct=100.0 * server_trace.between(f["first"], f["last"]) / span
        if span > 0
        else math.nan,
        failed=failed,
    )
