"""The phases of ``zerowindow bench proxy`` against one proxy, and the workload's sizes: the
synthetic upstream started pinned to a CPU, the proxy's processes found and pinned, a paced
latency trial, a saturation flood and the stalled streams' memory (the figures are described in
:mod:`harness.benchmarks._proxy_bench`)."""

from __future__ import annotations

import math
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import numpy as np
import psutil

from harness.benchmarks._common import (
    BenchError,
    Children,
    module_argv,
    pin_argv,
    proc_cpu_s,
    us_per_event,
)
from harness.benchmarks._upstream import read_streams
from harness.collectors import procs_rss_bytes
from harness.servers import Proxy


@dataclass
class ProxyWorkload:
    """The sizes of one proxy benchmark (defaults: the figures of bench/RESULTS.md)."""

    streams: int = 64
    rate: float = 50.0  # events/s per paced stream
    duration_s: float = 10.0  # of each paced trial
    repeats: int = 3  # latency trials per proxy
    flood_events: int = 5000  # per stream in the saturation phase
    event_bytes: int = 200
    stalled: int = 200
    stalled_kib: int = 128

    @property
    def paced_events(self) -> int:
        """Events each stream is sent in one latency trial."""
        return int(self.rate * self.duration_s)

    def check(self) -> None:
        """Raises :class:`BenchError` when a size cannot make a measurement."""
        not_positive = [k for k, v in vars(self).items() if v <= 0]
        if not_positive:
            raise BenchError(f"must be positive: {', '.join(sorted(not_positive))}")
        if self.event_bytes < 48:
            raise BenchError("event bytes: at least 48 (the stamp and the SSE framing)")
        if self.rate * self.duration_s < 2:
            raise BenchError("rate x duration: at least 2 events per paced stream")


def group_processes(proxy: Proxy) -> list[psutil.Process]:
    """Every process of the proxy's process groups."""
    pgids = set()
    for server in proxy.processes():
        if server.proc is not None:
            try:
                pgids.add(os.getpgid(server.proc.pid))
            except ProcessLookupError:
                pass
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) in pgids:
                out.append(p)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def cpu_s(procs: list[psutil.Process]) -> float:
    """CPU seconds used so far by ``procs`` (a process that is gone counts 0)."""
    return sum(c for c in (proc_cpu_s(p.pid) for p in procs) if not math.isnan(c))


def pin(procs: list[psutil.Process], cpu: int | None) -> None:
    """Pin every thread of ``procs`` to CPU ``cpu`` (``taskset -a``; nothing without ``cpu`` or
    ``taskset``)."""
    if cpu is not None and shutil.which("taskset"):
        for p in procs:
            subprocess.run(["taskset", "-a", "-p", "-c", str(cpu), str(p.pid)],
                           capture_output=True)  # fmt: skip


def latency_trial(port: int, w: ProxyWorkload) -> tuple[float, float, int]:
    """(p50, p99) in ms of one paced trial through ``port``, and the events lost."""
    events = w.paced_events
    warmup = min(int(w.rate), events // 2)  # each stream's first second, or its first half
    q = f"mode=paced&rate={w.rate:g}&events={events}&bytes={w.event_bytes}"
    decs = read_streams(port, w.streams, q, stamps=True)
    lost = w.streams * events - (sum(d.events for d in decs) - w.streams)  # without [DONE]s
    lat = np.concatenate([np.array(d.latencies[warmup:], dtype=float) for d in decs]) / 1e6
    if not lat.size:
        return float("nan"), float("nan"), lost
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99)), lost


def saturation(
    port: int, procs: list[psutil.Process], load: list[psutil.Process], w: ProxyWorkload
) -> tuple[float, float, float, float, float, int]:
    """(events/s, proxy CPU µs per event, events per proxy CPU-second, proxy CPU utilisation,
    load-side CPU utilisation, events lost) of one flood through ``port``."""
    q = f"mode=flood&events={w.flood_events}&bytes={w.event_bytes}"
    cpu0, load0, t0 = cpu_s(procs), cpu_s(load), time.monotonic()
    decs = read_streams(port, w.streams, q, stamps=False)
    wall, cpu = time.monotonic() - t0, cpu_s(procs) - cpu0
    load_util = (cpu_s(load) - load0) / wall
    got = sum(d.events for d in decs) - w.streams
    lost = w.streams * w.flood_events - got
    per_event = us_per_event(cpu, got)
    per_cpu_s = got / cpu if cpu > 0 else float("nan")
    return got / wall, per_event, per_cpu_s, cpu / wall, load_util, lost


def stalled_memory(port: int, procs: list[psutil.Process], w: ProxyWorkload) -> tuple[float, int]:
    """RSS grown per stalled stream (KiB), and how many were already cut when it was measured:
    ``w.stalled`` clients with a 4 KiB receive buffer that never read, each sent
    ``w.stalled_kib`` KiB through ``port``, measured 1 s after the requests were sent."""
    n_events = w.stalled_kib * 1024 // w.event_bytes
    before = procs_rss_bytes(procs)
    socks = []
    request = (
        f"GET /stream?mode=hold&events={n_events}&bytes={w.event_bytes} HTTP/1.1\r\n"
        "Host: bench\r\n\r\n"
    ).encode()
    try:
        for _ in range(w.stalled):
            s = socket.socket()
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", port))
            s.sendall(request)
        time.sleep(1.0)
        grown = procs_rss_bytes(procs) - before
        cut = 0
        for s in socks:
            s.setblocking(False)
            try:
                if s.recv(1, socket.MSG_PEEK) == b"":
                    cut += 1
            except BlockingIOError:
                pass
            except OSError:
                cut += 1
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)
    return grown / w.stalled / 1024, cut


def start_upstream(children: Children, cpu: int | None) -> tuple[int, psutil.Process]:
    """Start the bench's synthetic upstream (``harness.benchmarks._upstream``) among
    ``children``, pinned to ``cpu``; return its port and process once it listens. Raises
    :class:`BenchError` when it exits or does not listen within 15 s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [*pin_argv(cpu), *module_argv("harness.benchmarks._upstream", "--port", str(port))]
    proc = children.start(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return port, psutil.Process(proc.pid)
        except OSError:
            if proc.poll() is not None:
                raise BenchError(f"the bench upstream exited with code {proc.returncode}") from None
            if time.monotonic() > deadline:
                raise BenchError("the bench upstream did not listen within 15 s") from None
            time.sleep(0.1)
