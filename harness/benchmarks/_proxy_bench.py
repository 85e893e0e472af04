"""Benchmark of the proxy kinds on one SSE workload: what each costs healthy readers.

One synthetic upstream (``upstream`` sub-command: an asyncio/uvloop server that streams
chunked SSE events of ``--event-bytes`` bytes, each carrying the CLOCK_MONOTONIC time it was
written) and one raw-socket client run pinned to core 1; the proxy under test runs pinned to
core 0 (every process and thread of its group, ``taskset -a``). For each proxy:

- latency: ``--streams`` streams paced at ``--rate`` events/s each; per event, the time from
  the upstream's write to the client's read; the figure is p99 through the proxy minus p99
  direct (``none``), the latency the proxy adds. All proxies run at once and the trials go
  round-robin ``--repeats`` times; each proxy keeps its lowest p50 and p99 (load from
  elsewhere on the machine only ever adds latency);
- saturation: the same streams with the upstream writing as fast as each connection takes;
  events/s received by the client, the proxy's CPU seconds (utime+stime of its processes)
  per 1,000 events, and events per proxy CPU-second (events/s per core);
- stalled streams: ``--stalled`` clients with a 4 KiB receive buffer that never read, each
  sent ``--stalled-kib`` KiB that the upstream writes at once; the proxy's resident memory
  (RSS of its process group) grown per stalled stream, 1 s after the last byte was written.

    python bench/proxies.py --proxies none,egress,nginx-buffered,haproxy,haproxy-nodelay,envoy

The proxies run with their defaults except: every proxy's kernel send buffer toward clients
is 32 KiB (the egress buffer's default), nginx is the ``buffered-reset`` preset, HAProxy has
``timeout client 3s`` and ``option nolinger`` (``haproxy-nodelay``: also
``option http-no-delay``), Envoy a 3 s stream idle timeout, and the egress
buffer pauses reading the upstream when a stream's 256 KiB are full instead of cutting the
client (the saturation phase's upstream outruns even a reader that keeps up).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from harness.collectors._proxy_probe import procs_rss_bytes  # noqa: E402
from harness.servers import (
    EgressProxyConfig,
    EnvoyProxyConfig,
    HaproxyProxyConfig,
    NginxProxyConfig,
    NoProxyConfig,
    make_proxy,
)

PROXY_CPU, LOAD_CPU = "0", "1"
SNDBUF = 32 * 1024


def bench_configs() -> dict[str, Any]:
    """The proxy configurations the benchmark compares, by name."""
    return {
        "none": NoProxyConfig(),
        # pause, not cut, on overflow: under the saturation phase the upstream outruns even a
        # reader that keeps up, and a cut would end the healthy streams being measured
        "egress": EgressProxyConfig(kind="egress", overflow="pause"),
        "nginx-buffered": NginxProxyConfig(
            kind="nginx", preset="buffered-reset", client_sndbuf_bytes=SNDBUF
        ),
        "haproxy": HaproxyProxyConfig(
            kind="haproxy", timeout_client_s=3, nolinger=True, client_sndbuf_bytes=SNDBUF
        ),
        "haproxy-nodelay": HaproxyProxyConfig(
            kind="haproxy",
            timeout_client_s=3,
            nolinger=True,
            http_no_delay=True,
            client_sndbuf_bytes=SNDBUF,
        ),
        "envoy": EnvoyProxyConfig(
            kind="envoy", stream_idle_timeout_s=3, client_sndbuf_bytes=SNDBUF
        ),
    }


# --------------------------------------------------------------------------- upstream


def _event(i: int, pad: bytes) -> bytes:
    payload = b'data: {"t":%d,"i":%d,"p":"%s"}\n\n' % (time.monotonic_ns(), i, pad)
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_END = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


class _Upstream(asyncio.Protocol):
    """One connection: reads request heads (keep-alive) and streams per the query string:
    ``/stream?mode=paced|flood|hold&events=N&rate=R&bytes=B``; ``/health`` answers 200."""

    flood: set[_Upstream] = set()

    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False
        self.left = 0
        self.i = 0
        self.pad = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.left = 0
        _Upstream.flood.discard(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while not self.busy and b"\r\n\r\n" in self.buf:
            head, _, rest = self.buf.partition(b"\r\n\r\n")
            length = re.search(rb"(?i)content-length:\s*(\d+)", head)
            body = int(length.group(1)) if length else 0
            if len(rest) < body:
                return
            self.buf = rest[body:]
            self._serve(head.split(b" ", 2)[1].decode())

    def _serve(self, target: str) -> None:
        assert self.transport is not None
        path, _, query = target.partition("?")
        if path != "/stream":
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            return
        args = dict(kv.split("=") for kv in query.split("&") if "=" in kv)
        self.left, self.i = int(args.get("events", "100")), 0
        self.pad = b"x" * max(0, int(args.get("bytes", "200")) - 40)
        self.busy = True
        self.transport.write(_HEAD)
        mode = args.get("mode", "paced")
        if mode == "flood":
            _Upstream.flood.add(self)
        elif mode == "hold":
            self.transport.write(b"".join(_event(i, self.pad) for i in range(self.left)))
        else:
            asyncio.get_running_loop().create_task(self._paced(float(args.get("rate", "50"))))

    async def _paced(self, rate: float) -> None:
        period = 1.0 / rate
        start = time.monotonic()
        while self.left > 0 and self.transport is not None and not self.transport.is_closing():
            self.step()
            await asyncio.sleep(max(0.0, start + self.i * period - time.monotonic()))

    def step(self) -> None:
        """Write one event (and the end of the stream after the last)."""
        assert self.transport is not None
        self.transport.write(_event(self.i, self.pad))
        self.i += 1
        self.left -= 1
        if self.left == 0:
            self.transport.write(_END)
            self.busy = False
            _Upstream.flood.discard(self)
            if self.buf:
                self.data_received(b"")


async def _flood_loop() -> None:
    """The engine's step loop at full speed: one event per flooding stream whose transport
    has less than 64 KiB queued."""
    while True:
        for conn in list(_Upstream.flood):
            t = conn.transport
            if t is not None and not t.is_closing() and t.get_write_buffer_size() < 65536:
                conn.step()
        await asyncio.sleep(0 if _Upstream.flood else 0.005)


def serve_upstream(port: int) -> None:
    """Run the synthetic upstream on 127.0.0.1:``port`` until killed."""
    import uvloop

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Upstream, "127.0.0.1", port, backlog=4096)
        async with server:
            await _flood_loop()

    uvloop.run(main())


# --------------------------------------------------------------------------- client


class _Dechunker:
    """Incremental chunked-body decoder that counts SSE events and their ``t`` stamps."""

    _T = re.compile(rb'"t":(\d+)')

    def __init__(self, stamps: bool) -> None:
        self.raw = b""
        self.payload = b""
        self.events = 0
        self.done = False
        self.stamps = stamps
        self.latencies: list[int] = []

    def feed(self, data: bytes, now_ns: int) -> None:
        self.raw += data
        out = []
        while True:
            line_end = self.raw.find(b"\r\n")
            if line_end < 0:
                break
            size = int(self.raw[:line_end].split(b";")[0], 16)
            if size == 0:
                self.done = True
                break
            if len(self.raw) < line_end + 2 + size + 2:
                break
            out.append(self.raw[line_end + 2 : line_end + 2 + size])
            self.raw = self.raw[line_end + 2 + size + 2 :]
        if not out:
            return
        self.payload += b"".join(out)
        complete, sep, self.payload = self.payload.rpartition(b"\n\n")
        if not sep:
            self.payload = complete
            return
        self.events += complete.count(b"\n\n") + 1
        if self.stamps:
            self.latencies.extend(now_ns - int(t) for t in self._T.findall(complete))


async def _one_stream(port: int, query: str, stamps: bool, rcvbuf: int | None) -> _Dechunker:
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, f"GET /stream?{query} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
    dec = _Dechunker(stamps)
    head = b""
    while b"\r\n\r\n" not in head:
        data = await loop.sock_recv(sock, 65536)
        if not data:
            raise RuntimeError(f"closed before the head: {head!r}")
        head += data
    head, _, rest = head.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    dec.feed(rest, time.monotonic_ns())
    while not dec.done:
        try:
            data = await loop.sock_recv(sock, 262144)
        except ConnectionResetError:
            data = b""
        if not data:
            break
        dec.feed(data, time.monotonic_ns())
    sock.close()
    return dec


async def _streams(port: int, n: int, query: str, stamps: bool) -> list[_Dechunker]:
    return list(await asyncio.gather(*(_one_stream(port, query, stamps, None) for _ in range(n))))


def _run_async(coro: Any) -> Any:
    import uvloop

    return uvloop.run(coro)


# --------------------------------------------------------------------------- measurements


def _group(proxy: Any) -> list[psutil.Process]:
    proc = getattr(getattr(proxy, "server", None), "proc", None)
    if proc is None:
        return []
    pgid = os.getpgid(proc.pid)
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (psutil.Error, ProcessLookupError):
            pass
    return out


def _cpu_s(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def _pin(procs: list[psutil.Process], cpu: str) -> None:
    if shutil.which("taskset"):
        for p in procs:
            subprocess.run(["taskset", "-a", "-p", "-c", cpu, str(p.pid)], capture_output=True)


@dataclass
class ProxyResult:
    """One proxy's figures (None where not measured)."""

    proxy: str
    p50_ms: float
    p99_ms: float
    added_p99_ms: float | None
    events_per_s: float | None
    cpu_ms_per_1k_events: float | None
    events_per_cpu_s: float | None
    proxy_cpu_util: float | None
    load_cpu_util: float | None
    rss_per_stalled_kib: float | None
    stalled_cut: int | None


def _latency_trial(port: int, args: argparse.Namespace) -> tuple[float, float]:
    """(p50, p99) in ms of one paced trial through ``port``."""
    events = int(args.rate * args.duration_s)
    q = f"mode=paced&rate={args.rate}&events={events}&bytes={args.event_bytes}"
    decs = _run_async(_streams(port, args.streams, q, stamps=True))
    got = sum(d.events for d in decs) - args.streams  # without each [DONE]
    assert got == args.streams * events, f"{got} events of {args.streams * events}"
    lat = np.concatenate([np.array(d.latencies[int(args.rate) :]) for d in decs]) / 1e6
    return float(np.percentile(lat, 50)), float(np.percentile(lat, 99))


def _saturation(
    port: int, procs: list[psutil.Process], args: argparse.Namespace
) -> tuple[float, float, float, float, float]:
    """(events/s, proxy CPU ms per 1,000 events, events per proxy CPU-second, proxy CPU
    utilisation, load-side CPU utilisation) of one flood through ``port``."""
    q = f"mode=flood&events={args.flood_events}&bytes={args.event_bytes}"
    load_procs = [psutil.Process(args.upstream_pid), psutil.Process()]
    cpu0, load0, t0 = _cpu_s(procs), _cpu_s(load_procs), time.monotonic()
    decs = _run_async(_streams(port, args.streams, q, stamps=False))
    wall, cpu = time.monotonic() - t0, _cpu_s(procs) - cpu0
    load = (_cpu_s(load_procs) - load0) / wall
    got = sum(d.events for d in decs) - args.streams
    assert got == args.streams * args.flood_events, f"{got} flood events"
    return got / wall, cpu / got * 1e6, got / cpu, cpu / wall, load


def measure_all(
    names: list[str], upstream_port: int, args: argparse.Namespace
) -> list[ProxyResult]:
    """Start every proxy in ``names`` (pinned to PROXY_CPU); run the latency trials
    round-robin ``args.repeats`` times (so a burst of load from elsewhere on the machine hits
    every proxy alike) keeping each proxy's lowest p50 and p99; then the saturation and
    stalled phases proxy by proxy; stop them all."""
    configs = bench_configs()
    started: dict[str, tuple[Any, int, list[psutil.Process]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-proxies-") as tmp:
        try:
            for name in names:
                proxy = make_proxy(configs[name])
                started[name] = (proxy, 0, [])
                url = proxy.start(Path(tmp) / name, f"http://127.0.0.1:{upstream_port}")
                procs = _group(proxy)
                _pin(procs, PROXY_CPU)
                started[name] = (proxy, int(url.rsplit(":", 1)[1]), procs)
            trials: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
            for _ in range(args.repeats):
                for name in names:
                    trials[name].append(_latency_trial(started[name][1], args))
            results = []
            base_p99 = min(t[1] for t in trials["none"])
            for name in names:
                _, port, procs = started[name]
                p50 = min(t[0] for t in trials[name])
                p99 = min(t[1] for t in trials[name])
                # stalled first: after the saturation phase the proxy's allocator keeps the
                # pages it grew to, and the stalled streams' buffers would reuse them unseen
                stalled = _stalled(port, procs, args) if procs else (None, None)
                sat = _saturation(port, procs, args) if procs else (None,) * 5
                r = ProxyResult(
                    name, p50, p99, None if name == "none" else p99 - base_p99, *sat, *stalled
                )
                results.append(r)
                print(json.dumps(asdict(r)) if args.json else r, flush=True)
            return results
        finally:
            for proxy, _, _ in started.values():
                proxy.stop()


def _stalled(port: int, procs: list[psutil.Process], args: argparse.Namespace) -> tuple[float, int]:
    """RSS grown per stalled stream, and how many were already cut when it was measured."""
    n_events = args.stalled_kib * 1024 // args.event_bytes
    before = procs_rss_bytes(procs)
    socks = []
    request = (
        f"GET /stream?mode=hold&events={n_events}&bytes={args.event_bytes} HTTP/1.1\r\n"
        "Host: bench\r\n\r\n"
    ).encode()
    for _ in range(args.stalled):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", port))
        s.sendall(request)
        socks.append(s)
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
        s.close()
    time.sleep(0.5)
    return grown / args.stalled / 1024, cut


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/proxies.py", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--proxies", default="none,egress,nginx-buffered,haproxy,haproxy-nodelay,envoy"
    )
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rate", type=float, default=50.0, help="events/s per paced stream")
    parser.add_argument("--duration-s", type=float, default=10.0, help="of the paced phase")
    parser.add_argument("--flood-events", type=int, default=5000, help="per flooding stream")
    parser.add_argument("--event-bytes", type=int, default=200)
    parser.add_argument("--stalled", type=int, default=200)
    parser.add_argument("--stalled-kib", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3, help="latency trials per proxy")
    parser.add_argument("--json", action="store_true", help="print results as JSON lines")
    return parser


def command_line(args: argparse.Namespace) -> str:
    return (
        f"python bench/proxies.py --proxies {args.proxies} --streams {args.streams} "
        f"--rate {args.rate:g} --duration-s {args.duration_s:g} --repeats {args.repeats} "
        f"--flood-events {args.flood_events} --event-bytes {args.event_bytes} "
        f"--stalled {args.stalled} --stalled-kib {args.stalled_kib}"
    )


def run(args: argparse.Namespace) -> list[ProxyResult]:
    """Start the upstream, measure every proxy named in ``args.proxies`` (``none`` first,
    the baseline), stop the upstream."""
    configs = bench_configs()
    names = args.proxies.split(",")
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise SystemExit(f"unknown proxies {unknown}; valid: {sorted(configs)}")
    names = ["none"] + [n for n in names if n != "none"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        up_port = s.getsockname()[1]
    cmd = [sys.executable, __file__, "upstream", "--port", str(up_port)]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", LOAD_CPU, *cmd]
    upstream = subprocess.Popen(cmd, start_new_session=True)
    args.upstream_pid = upstream.pid
    os.sched_setaffinity(0, {int(LOAD_CPU)})
    results: list[ProxyResult] = []
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection(("127.0.0.1", up_port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        results = measure_all(names, up_port, args)
    finally:
        upstream.terminate()
        upstream.wait(10)
    return results


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["upstream"]:
        p = argparse.ArgumentParser()
        p.add_argument("--port", type=int, required=True)
        serve_upstream(p.parse_args(argv[1:]).port)
        return 0
    run(build_parser().parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
