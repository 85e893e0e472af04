"""The egress buffer's CPU per event, lever by lever, against nginx in the same run.

Each lever is one setting of the egress buffer changed from the configuration ``zerowindow
bench proxy`` measures (``egress``: uvloop, ``TCP_NOTSENT_LOWAT`` 16 KiB, ``TCP_NODELAY``, a
32 KiB send buffer, pausing the upstream at 256 KiB); beside them, a byte pipe on uvloop
(``_byte_pipe.py``), the floor under any proxy in Python (it parses and watches nothing).
Every configuration runs the proxy bench's saturation phase
(:func:`harness.benchmarks._proxy_phases.saturation`: the bench upstream and client pinned to
one CPU, the proxy to the other, ``streams`` streams of
``events`` events of ``event_bytes`` bytes each, written as fast as each connection takes);
the rounds go over every configuration in turn so that the machine's drift hits them alike, and
each configuration's median CPU µs per event is kept.

``python bench/_egress_levers.py --rounds 5`` prints one JSON object; ``bench/run.py --only
egress-levers`` writes the section of bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from harness.benchmarks._common import Children, placement, raise_nofile
from harness.benchmarks._proxy_bench import bench_configs
from harness.benchmarks._proxy_phases import (
    ProxyWorkload,
    group_processes,
    pin,
    saturation,
    start_upstream,
)
from harness.servers import make_proxy
from harness.servers._command import CommandProxyConfig

LEVERS: dict[str, dict[str, object]] = {
    "egress": {},
    "egress, asyncio's loop": {"event_loop": "asyncio"},
    "egress, no TCP_NOTSENT_LOWAT": {"client_notsent_lowat_bytes": None},
    "egress, no TCP_NODELAY (Nagle)": {"client_tcp_nodelay": False},
}
"""Egress configurations by name: the bench's ``egress`` with these fields changed."""
FLOOR = "a byte pipe on uvloop (the floor)"
"""The configuration of ``bench/_byte_pipe.py``: what any proxy in Python on uvloop costs."""


@dataclass
class LeverResult:
    """One configuration's saturation trials: CPU µs per event of each round, their median,
    events per CPU-second at the median, and that against nginx's."""

    name: str
    cpu_us_per_event: list[float]
    median_us: float
    events_per_cpu_s: float
    x_nginx: float | None = None


def measure(rounds: int, w: ProxyWorkload) -> list[LeverResult]:
    """Run ``rounds`` rounds of the saturation phase over nginx and every lever; see the
    module docstring. Raises ``harness.benchmarks.BenchError`` if a proxy does not start."""
    base = bench_configs()
    configs = {"nginx": base["nginx"]}
    configs |= {name: base["egress"].model_copy(update=up) for name, up in LEVERS.items()}
    pipe = Path(__file__).with_name("_byte_pipe.py")
    argv = [sys.executable, str(pipe), "{listen}", "{upstream_port}"]
    configs[FLOOR] = CommandProxyConfig(argv=argv)
    pair = placement()
    proxy_cpu, load_cpu = pair if pair is not None else (None, None)
    affinity = os.sched_getaffinity(0)
    raise_nofile()
    per_event: dict[str, list[float]] = {name: [] for name in configs}
    try:
        with Children() as children, tempfile.TemporaryDirectory(prefix="zw-levers-") as tmp:
            port, upstream = start_upstream(children, load_cpu)
            if load_cpu is not None:
                os.sched_setaffinity(0, {load_cpu})
            load = [upstream, psutil.Process()]
            for _ in range(rounds):
                for name, config in configs.items():
                    proxy = make_proxy(config)
                    try:
                        folder = Path(tmp) / f"{len(per_event[name])}-{sorted(configs).index(name)}"
                        url = proxy.start(folder, f"http://127.0.0.1:{port}")
                        procs = group_processes(proxy)
                        pin(procs, proxy_cpu)
                        _, us, _, _, _, _ = saturation(int(url.rsplit(":", 1)[1]), procs, load, w)
                        per_event[name].append(us)
                    finally:
                        proxy.stop()
    finally:
        os.sched_setaffinity(0, affinity)
    out = []
    for name, values in per_event.items():
        median = statistics.median(values)
        out.append(LeverResult(name, values, median, 1e6 / median))
    nginx = out[0].events_per_cpu_s
    for r in out:
        r.x_nginx = r.events_per_cpu_s / nginx
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--events", type=int, default=5000)
    parser.add_argument("--event-bytes", type=int, default=200)
    args = parser.parse_args()
    w = ProxyWorkload(streams=args.streams, flood_events=args.events, event_bytes=args.event_bytes)
    print(json.dumps([asdict(r) for r in measure(args.rounds, w)], indent=1))


if __name__ == "__main__":
    main()
