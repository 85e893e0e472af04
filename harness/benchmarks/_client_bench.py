"""Benchmarks of the load generator itself: how many slow streams one load process holds, how
many SSE events per second it parses and timestamps, and how exact its ITL is.

The server is ``bench/_sse_server.py`` (pinned to core 0), which stamps each chunk with its
CLOCK_MONOTONIC emission time; the client (pinned to core 1) is one real Locust process running
the toolkit's locustfile and user classes (``python -m locust -f loadgen/locustfile.py
--zw-group-config ...``), exactly as ``zerowindow run`` starts a group, or vLLM's benchmark
request function (``bench/_vllm_client.py``) on the same workload.

ITL error: for every pair of consecutive chunks of a stream, the gap the client measured minus
the gap between the server's emission times, in ms (absolute value; p50, p99). Delivery delay:
client timestamp minus emission time (both CLOCK_MONOTONIC of this machine).

    python bench/_loadgen_bench.py slow --streams 10000
    python bench/_loadgen_bench.py itl --streams 100 --interval-ms 5 --events 2000
    python bench/_loadgen_bench.py itl --client vllm --streams 100 --interval-ms 5 --events 2000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "bench" / "_sse_server.py"
VLLM_CLIENT = ROOT / "bench" / "_vllm_client.py"
LOCUSTFILE = ROOT / "loadgen" / "locustfile.py"
SERVER_CPU, CLIENT_CPU = "0", "1"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def _pin(cpu: str) -> list[str]:
    return ["taskset", "-c", cpu] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


def _raise_nofile() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Server:
    """The bench SSE server as a child process, its stats lines collected by a thread."""

    def __init__(self, *, events: int, interval_ms: float, loop: str = "asyncio") -> None:
        _raise_nofile()
        self.argv = [
            *_pin(SERVER_CPU), sys.executable, str(SERVER), "--port", "0",
            "--events", str(events), "--interval-ms", str(interval_ms), "--loop", loop,
            "--stats-interval-s", "0.5",
        ]  # fmt: skip
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        first = json.loads(self.proc.stdout.readline())
        self.port = int(first["listening"])
        self.stats: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.stats.append(json.loads(line))
            except ValueError:
                pass

    def latest(self) -> dict[str, Any]:
        return self.stats[-1] if self.stats else {"open": 0, "events": 0}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _group_config(
    path: Path, *, port: int, streams: int, events: int, read: dict, rcvbuf: int | None
) -> None:
    config = {
        "group": {
            "name": "bench", "users": streams, "requests_per_user": 1, "prompt_tokens": 1,
            "max_tokens": events, "timeout_s": 3600, "read": read, "rcvbuf_bytes": rcvbuf,
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
    argv = [
        *_pin(CLIENT_CPU), sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
        "-u", str(users), "-r", str(spawn_rate), "--run-time", f"{run_time_s}s",
        "--stop-timeout", "0", "--only-summary", "--loglevel", "WARNING",
        "--zw-group-config", str(workdir / "group.json"),
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "ZW_SATURATION": str(workdir / "saturation-bench.jsonl"),
    }
    return argv, env


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime, stime


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return math.nan


def _saturation(
    path: Path, window: tuple[float, float] = (-math.inf, math.inf)
) -> tuple[float, float]:
    """(CPU p50 %, loop lag p99 ms) of the sampler's samples taken within ``window``."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    rows = [r for r in rows if window[0] <= r["t"] <= window[1]]
    return (
        percentile([r["cpu_pct"] for r in rows], 50),
        percentile([r["loop_lag_ms"] for r in rows], 99),
    )


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
    command: str


def run_slow(
    *, streams: int, bytes_per_s: int = 64, rcvbuf: int = 4096, window_s: float = 15.0
) -> SlowResult:
    """Hold ``streams`` slow readers (``bytes_per_s`` per stream in one ``recv`` per second,
    ``SO_RCVBUF=rcvbuf``) in one Locust process; measure its CPU over ``window_s`` seconds once
    every stream is open (or the count stopped rising)."""
    workdir = Path(tempfile.mkdtemp(prefix="zw-bench-slow-"))
    server = Server(events=1_000_000, interval_ms=1000)
    read = {"kind": "paced", "bytes_per_read": bytes_per_s, "interval_s": 1.0}
    _group_config(
        workdir / "group.json", port=server.port, streams=streams, events=1_000_000, read=read,
        rcvbuf=rcvbuf,
    )  # fmt: skip
    spawn_rate = 1000
    ramp_s = streams / spawn_rate
    run_time = int(ramp_s + window_s + 140)
    argv, env = _locust(workdir, users=streams, spawn_rate=spawn_rate, run_time_s=run_time)
    _raise_nofile()
    log = open(workdir / "locust.log", "wb")  # noqa: SIM115 - a pipe nobody reads would block it
    proc = subprocess.Popen(argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
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
        c0, w0 = _cpu_s(proc.pid), time.monotonic()
        while time.monotonic() - w0 < window_s:
            time.sleep(0.5)
            opened.append(int(server.latest()["open"]))
        c1, w1 = _cpu_s(proc.pid), time.monotonic()
        rss = _rss_mib(proc.pid)
        proc.terminate()  # Locust stops its users: every stream is recorded as interrupted
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    rates = []
    records = workdir / "records-bench.jsonl"
    if records.exists():
        for line in records.read_text().splitlines():
            r = json.loads(line)
            first, last = r.get("t_first_byte"), r.get("t_last_byte")
            if first and last and last - first > 5:
                rates.append(r["bytes_received"] / (last - first))
    _, lag_p99 = _saturation(workdir / "saturation-bench.jsonl", (w0, w1))
    log.close()
    if min(opened, default=0) < streams:  # say why, from the load process's own log
        tail = (workdir / "locust.log").read_text(errors="replace")[-1500:]
        print(f"slow readers: not every stream opened; Locust log ends:\n{tail}", file=sys.stderr)
    shutil.rmtree(workdir, ignore_errors=True)
    return SlowResult(
        target_streams=streams,
        streams_open=min(opened) if opened else 0,
        cpu_pct=100.0 * (c1 - c0) / (w1 - w0),
        rss_mib=rss,
        loop_lag_p99_ms=lag_p99,
        read_rate_p50_bytes_per_s=percentile(rates, 50),
        window_s=w1 - w0,
        ramp_s=ramp_done_s,
        command=f"python bench/_loadgen_bench.py slow --streams {streams}",
    )


@dataclass
class ItlResult:
    """Full-speed consumption and ITL accuracy of one client on one workload."""

    client: str  # "zerowindow" | "vllm"
    streams: int
    interval_ms: float  # server's gap between a stream's chunks (0: as fast as possible)
    offered_events_per_s: float  # streams / interval (inf for 0)
    events: int  # chunks the client recorded
    events_per_s: float
    itl_err_p50_ms: float
    itl_err_p99_ms: float
    delay_p50_ms: float
    delay_p99_ms: float
    cpu_pct: float  # client process, % of one core while streaming (mean)
    failed: int
    command: str


def _errors(streams: list[tuple[list[float], list[int]]]) -> dict[str, float]:
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
        inside = sum(sum(1 for x in t if start <= x <= end) for t in live)
        rate = inside / (end - start)
    else:  # no common window worth the name: the whole span
        rate = count / (last - first) if count > 1 and last > first else math.nan
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


def _emit_times(text: str) -> list[int]:
    return [int(x) for x in text.split()]


def run_itl(*, client: str, streams: int, interval_ms: float, events: int) -> ItlResult:
    """Stream ``events`` chunks on each of ``streams`` concurrent requests, one every
    ``interval_ms`` (0: as fast as possible) and measure the client."""
    workdir = Path(tempfile.mkdtemp(prefix="zw-bench-itl-"))
    server = Server(events=events, interval_ms=interval_ms)
    command = (
        f"python bench/_loadgen_bench.py itl --client {client} --streams {streams} "
        f"--interval-ms {interval_ms:g} --events {events}"
    )
    failed = 0
    try:
        if client == "zerowindow":
            _group_config(
                workdir / "group.json", port=server.port, streams=streams, events=events,
                read={"kind": "full_speed"}, rcvbuf=None,
            )  # fmt: skip
            argv, env = _locust(workdir, users=streams, spawn_rate=streams, run_time_s=600)
            proc = subprocess.run(
                argv, env=env, cwd=workdir, capture_output=True, text=True, timeout=900
            )
            if proc.returncode != 0:
                raise RuntimeError(f"locust failed: {proc.stderr[-2000:]}")
            per_stream = []
            for line in (workdir / "records-bench.jsonl").read_text().splitlines():
                r = json.loads(line)
                failed += r["outcome"] != "complete"
                chunks = [c for c in r["chunks"] if c["text"].strip()]
                per_stream.append(([c["t"] for c in chunks], [int(c["text"]) for c in chunks]))
            sat_path = workdir / "saturation-bench.jsonl"
        elif client == "vllm":
            out = workdir / "vllm.json"
            argv = [
                *_pin(CLIENT_CPU), sys.executable, str(VLLM_CLIENT),
                "--url", f"http://127.0.0.1:{server.port}/v1/completions",
                "--streams", str(streams), "--events", str(events), "--out", str(out),
            ]  # fmt: skip
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(f"vLLM client failed: {proc.stderr[-2000:]}")
            data = json.loads(out.read_text())
            per_stream = []
            for r in data["requests"]:
                failed += not r["success"]
                t = [r["start_time"] + r["ttft"]]
                for gap in r["itl"]:
                    t.append(t[-1] + gap)
                emit = _emit_times(r["generated_text"])
                n = min(len(t), len(emit))
                per_stream.append((t[:n], emit[:n]))
            cpu = 100.0 * data["cpu_s"] / data["wall_s"]
            sat_path = None
        else:
            raise ValueError(f"unknown client {client!r}: zerowindow or vllm")
        figures = _errors(per_stream)
        if sat_path is not None:  # ours: mean CPU of the samples taken while streaming
            rows = [json.loads(x) for x in sat_path.read_text().splitlines()]
            inside = [r["cpu_pct"] for r in rows if figures["first"] <= r["t"] <= figures["last"]]
            cpu = sum(inside) / len(inside) if inside else math.nan
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return ItlResult(
        client=client,
        streams=streams,
        interval_ms=interval_ms,
        offered_events_per_s=streams * 1000.0 / interval_ms if interval_ms else math.inf,
        events=int(figures["events"]),
        events_per_s=figures["events_per_s"],
        itl_err_p50_ms=figures["itl_err_p50_ms"],
        itl_err_p99_ms=figures["itl_err_p99_ms"],
        delay_p50_ms=figures["delay_p50_ms"],
        delay_p99_ms=figures["delay_p99_ms"],
        cpu_pct=cpu,
        failed=failed,
        command=command,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    slow = sub.add_parser("slow", help="slow-reader capacity of one load process")
    slow.add_argument("--streams", type=int, default=10_000)
    slow.add_argument("--window-s", type=float, default=15.0)
    itl = sub.add_parser("itl", help="full-speed consumption and ITL error")
    itl.add_argument("--client", choices=("zerowindow", "vllm"), default="zerowindow")
    itl.add_argument("--streams", type=int, default=100)
    itl.add_argument("--interval-ms", type=float, default=5.0)
    itl.add_argument("--events", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.what == "slow":
        result: Any = run_slow(streams=args.streams, window_s=args.window_s)
    else:
        result = run_itl(
            client=args.client, streams=args.streams, interval_ms=args.interval_ms,
            events=args.events,
        )  # fmt: skip
    print(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
