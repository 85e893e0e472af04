"""Send lag of one load process: how close one Locust process running the toolkit's locustfile
keeps an open-loop (Poisson) schedule against the bench SSE server, as ``t_send -
t_scheduled`` over every request."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from harness.benchmarks._bench_server import SseServer
from harness.benchmarks._common import BenchError, Children, percentile
from harness.benchmarks._locust_load import (
    RECORDS,
    SATURATION,
    last_line,
    locust_command,
    loop_lag_p99,
    write_group_config,
)


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
            write_group_config(
                workdir / "group.json", port=server.port, streams=1, events=events,
                read={"kind": "full_speed"}, rcvbuf=None, arrival=arrival,
            )  # fmt: skip
            argv, env = locust_command(
                workdir, users=1, spawn_rate=1, run_time_s=int(duration_s + 60)
            )
            with open(workdir / "locust.log", "wb") as log:
                proc = children.start(
                    argv, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
                )
            children.wait(proc, timeout_s=duration_s + 90)
        path = workdir / RECORDS
        lines = path.read_text().splitlines() if path.exists() else []
        records = [json.loads(line) for line in lines]
        if not records:
            raise BenchError(f"Locust wrote no records: {last_line(workdir / 'locust.log')}")
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
            loop_lag_p99_ms=loop_lag_p99(workdir / SATURATION, window),
            command=(
                f"python bench/run.py --only openloop  # Poisson {rate_rps:g} requests/s for "
                f"{duration_s:g} s, {events} chunks {interval_ms:g} ms apart each"
            ),
        )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
