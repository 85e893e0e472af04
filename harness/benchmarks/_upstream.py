"""The proxy benchmark's two ends: a synthetic SSE upstream and a raw-socket client.

The upstream (``python -m harness.benchmarks._upstream --port P``; uvloop when installed)
streams chunked SSE events of ``bytes`` bytes, each carrying the CLOCK_MONOTONIC time it was
written, per the query string: ``/stream?mode=paced|flood|hold&events=N&rate=R&bytes=B``
(paced: ``rate`` events/s; flood: as fast as the connection takes them; hold: every event at
once); ``/health`` answers 200. The client reads whole streams and counts their events, and
the latency of each (read time minus the stamp) when asked.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import signal
import socket
import sys
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import httptools

from harness.benchmarks._common import BenchInterrupted

T = TypeVar("T")


def run_loop(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on uvloop when it is installed, else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


def run_interruptible(coro: Coroutine[Any, Any, T]) -> T:
    """:func:`run_loop`, where SIGINT, SIGTERM or SIGHUP cancel ``coro`` and raise
    :class:`BenchInterrupted` (uvloop only logs what a Python signal handler raises); the
    process's own handlers are put back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        return run_loop(coro)
    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in watched}
    caught: list[int] = []

    async def main() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_signal(sig: int) -> None:
            caught.append(sig)
            task.cancel()

        for sig in watched:
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            return await coro
        finally:
            for sig in watched:
                loop.remove_signal_handler(sig)

    try:
        return run_loop(main())
    except asyncio.CancelledError:
        if caught:
            raise BenchInterrupted(signal.Signals(caught[0]).name) from None
        raise
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)


def _event(i: int, pad: bytes) -> bytes:
    payload = b'data: {"t":%d,"i":%d,"p":"%s"}\n\n' % (time.monotonic_ns(), i, pad)
    return b"%x\r\n%s\r\n" % (len(payload), payload)


_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\n\r\n"
)
_END = b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"


class _Upstream(asyncio.Protocol):
    """One connection: reads request heads (keep-alive) and streams per the query string."""

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

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(_Upstream, "127.0.0.1", port, backlog=4096)
        async with server:
            await _flood_loop()

    run_loop(main())


class StreamReader:
    """One response read by the raw client: framing by httptools (llhttp), SSE events counted
    at each blank line, and, with ``stamps``, each event's ``t`` stamp (CLOCK_MONOTONIC ns at
    the upstream's write) turned into a latency at the read that completed it.

    ``status`` is the response's status code (0 before its head), ``done`` whether the message
    ended, ``events`` the events counted, ``latencies`` ns per event. (It replaced a hand-made
    chunk decoder that dropped an event whose ``\\n\\n`` a proxy's re-chunking split: the
    319,999 of 320,000 events once blamed on the egress buffer.)"""

    _T = re.compile(rb'"t":(\d+)')

    def __init__(self, stamps: bool) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.payload = b""  # the unfinished event
        self.body: list[bytes] = []
        self.status = 0
        self.events = 0
        self.done = False
        self.stamps = stamps
        self.latencies: list[int] = []

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        self.body.append(data)

    def on_message_complete(self) -> None:
        self.done = True

    def feed(self, data: bytes, now_ns: int) -> None:
        """Parse one read. Raises ``httptools.HttpParserError`` for a malformed response."""
        self.parser.feed_data(data)
        if not self.body:
            return
        payload = self.payload + b"".join(self.body)
        self.body.clear()
        # No separator: rpartition gives (b"", b"", payload) and the partial event stays.
        complete, sep, self.payload = payload.rpartition(b"\n\n")
        if not sep:
            return
        self.events += complete.count(b"\n\n") + 1
        if self.stamps:
            self.latencies.extend(now_ns - int(t) for t in self._T.findall(complete))


async def _one_stream(port: int, query: str, stamps: bool) -> StreamReader:
    sock = socket.socket()
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        request = f"GET /stream?{query} HTTP/1.1\r\nHost: bench\r\n\r\n".encode()
        await loop.sock_sendall(sock, request)
        reader = StreamReader(stamps)
        while not reader.done:
            try:
                data = await loop.sock_recv(sock, 262144)
            except ConnectionResetError:
                data = b""
            if not data:
                if not reader.status:
                    raise ConnectionError("closed before the response head")
                break
            try:
                reader.feed(data, time.monotonic_ns())
            except httptools.HttpParserError as exc:
                raise ConnectionError(f"malformed response: {exc}") from None
            if reader.status and reader.status != 200:
                raise ConnectionError(f"answered {reader.status}")
        return reader
    finally:
        sock.close()


def read_streams(port: int, n: int, query: str, *, stamps: bool) -> list[StreamReader]:
    """Open ``n`` streams ``/stream?QUERY`` on 127.0.0.1:``port`` at once and read each to its
    end. Raises ``ConnectionError`` when one is refused or answered other than 200."""

    async def main() -> list[StreamReader]:
        return list(await asyncio.gather(*(_one_stream(port, query, stamps) for _ in range(n))))

    return run_interruptible(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    serve_upstream(parser.parse_args(argv).port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
