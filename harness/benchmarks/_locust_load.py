"""The toolkit's load client as the client benchmarks run it: one Locust process with the
toolkit's locustfile and user classes (``python -m locust -f loadgen/locustfile.py
--zw-group-config ...``), pinned to the client's CPU, as ``zerowindow run`` starts a group
(saturation sampler included); its group configuration, and what its files say afterwards."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import loadgen
from harness.benchmarks._bench_server import bench_cpus
from harness.benchmarks._common import percentile, pin_argv

LOCUSTFILE = Path(loadgen.__file__).with_name("locustfile.py")
RECORDS = "records-bench.jsonl"
"""The records file of the group, in the work folder."""
SATURATION = "saturation-bench.jsonl"
"""The saturation sampler's file, in the work folder."""


def write_group_config(
    path: Path, *, port: int, streams: int, events: int, read: dict[str, Any],
    rcvbuf: int | None, timestamps: str = "kernel", arrival: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Write the group ``bench`` to ``path`` (JSON, ``--zw-group-config``): ``streams`` users
    of one request each (or the open-loop ``arrival``) asking the bench server on ``port`` for
    ``events`` chunks, read as ``read`` says with ``SO_RCVBUF=rcvbuf``; records to
    :data:`RECORDS` beside ``path``."""
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
        "records_path": str(path.parent / RECORDS),
        "seed": 0,
    }  # fmt: skip
    path.write_text(json.dumps(config))


def locust_command(
    workdir: Path, *, users: int, spawn_rate: int, run_time_s: int
) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of one Locust process running the group in ``workdir/group.json``
    (saturation samples to :data:`SATURATION` in ``workdir``)."""
    argv = [
        *pin_argv(bench_cpus()[1]), sys.executable, "-m", "locust", "-f", str(LOCUSTFILE),
        "--headless", "-u", str(users), "-r", str(spawn_rate), "--run-time", f"{run_time_s}s",
        "--stop-timeout", "0", "--only-summary", "--loglevel", "WARNING",
        "--zw-group-config", str(workdir / "group.json"),
    ]  # fmt: skip
    env = {**os.environ, "ZW_SATURATION": str(workdir / SATURATION)}
    return argv, env


def loop_lag_p99(path: Path, window: tuple[float, float]) -> float:
    """The gevent hub's loop lag p99 (ms) of the sampler's samples taken within ``window``
    (monotonic s); NaN without samples."""
    rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    return percentile([r["loop_lag_ms"] for r in rows if window[0] <= r["t"] <= window[1]], 99)


def log_tail(path: Path, n: int = 1500) -> str:
    """The last ``n`` characters of a log ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def last_line(path: Path) -> str:
    """The last non-empty line of a log (what a failed program said last)."""
    lines = [line.strip() for line in log_tail(path, 4000).splitlines() if line.strip()]
    return lines[-1] if lines else f"nothing in {path.name}"
