"""Every event through the egress buffer under load, beside a stalled neighbour.

Several readers take chunked SSE streams at full speed through a real ``EgressProxy`` (real
sockets, a real local upstream) while one client on the same proxy never reads. Each
upstream stream is deterministic from its id and cut into chunks of random sizes (events
split across chunks and several in one), so the proxy's reads end anywhere in the chunked
framing. Every reader must get every byte, in order, in a complete message; the stalled
client must be reset by the stall timeout and its upstream request aborted.

Readers: HTTP/1.1 with two requests on one connection (the chunked body passed through,
then keep-alive) and HTTP/1.0 (the body re-framed, close-delimited). Run on asyncio's event
loop and, when installed, uvloop's. No timing assertions beyond generous bounds.
"""

from __future__ import annotations

import asyncio
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import h11
import pytest

from harness._egress import EgressConfig
from harness._egress._proxy import EgressCore
from tests.test_egress_helpers import ECONNRESET, raw_client, socket_error, wait_reset

STREAMS_11 = 5
"""HTTP/1.1 readers, two streams each."""
EVENTS = 4000
"""Events per stream."""
STALL_TIMEOUT_S = 1.5
HOLD_BYTES = 16 * 1024 * 1024
"""What the stalled client's upstream would send: far more than every buffer on the way."""


def events(stream: int) -> bytes:
    """The SSE payload of stream ``stream``: ``EVENTS`` events of 30 to 400 bytes."""
    rng = random.Random(stream)
    return b"".join(
        b'data: {"s":%d,"i":%d,"p":"%s"}\n\n' % (stream, i, b"x" * rng.randint(0, 370))
        for i in range(EVENTS)
    )


# --------------------------------------------------------------------------- upstream


class Upstream:
    """A chunked SSE server on 127.0.0.1 in a thread (asyncio streams). ``GET /s?id=N``
    streams ``events(N)`` in chunks of random sizes, as fast as the connection takes;
    ``GET /hold`` writes up to ``HOLD_BYTES`` the same way. ``outcomes`` maps a stream id
    (``hold`` for the latter) to ``done`` or ``aborted`` (the proxy closed the connection)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.port = 0
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, OSError):
            writer.close()
            return
        target = head.split(b" ", 2)[1].decode()
        key = "hold" if target == "/hold" else target.split("id=")[1]
        if key == "hold":
            payload = b"data: " + b"h" * 1000 + b"\n\n"
            body = payload * (HOLD_BYTES // len(payload))
        else:
            body = events(int(key))
        rng = random.Random(f"chunks-{key}")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        try:
            pos = 0
            while pos < len(body):
                piece = body[pos : pos + rng.choice((1, 7, 200, 600, 3000, 20000))]
                pos += len(piece)
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                if writer.transport.get_write_buffer_size() > 65536:
                    await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()
            self.outcomes[key] = "done"
            await reader.read()  # the proxy closes after the response ("connection: close")
        except OSError:
            self.outcomes[key] = "aborted"
        finally:
            writer.close()

    def __enter__(self) -> Upstream:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


# --------------------------------------------------------------------------- proxy


@contextmanager
def egress(upstream_port: int, run: Callable[..., object]) -> Iterator[tuple[EgressCore, int]]:
    """An egress buffer (``overflow="pause"``, so that only the stall timeout cuts) served in a
    thread by ``run`` (``asyncio.run`` or ``uvloop.run``); yields its core and its port."""
    cfg = EgressConfig(
        upstream_url=f"http://127.0.0.1:{upstream_port}",
        listen_port=0,
        overflow="pause",
        stall_timeout_s=STALL_TIMEOUT_S,
    )
    core = EgressCore(cfg)
    sock = socket.create_server(("127.0.0.1", 0), backlog=128)
    started = threading.Event()
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    async def main() -> None:
        stop = asyncio.Event()
        running.append((asyncio.get_running_loop(), stop))
        await core.run(sock, None, stop=stop, on_started=started.set)

    thread = threading.Thread(target=lambda: run(main()), daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield core, sock.getsockname()[1]
    finally:
        loop, stop = running[0]
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)
        sock.close()


# --------------------------------------------------------------------------- readers


def read_http11(port: int, streams: list[int], got: dict[int, bytes]) -> None:
    """Request ``streams`` one after another on one connection, at full speed, parsing the
    responses with h11; the payloads go to ``got``."""
    conn = h11.Connection(h11.CLIENT)
    sock = raw_client(port)
    try:
        for n, stream in enumerate(streams):
            last = n == len(streams) - 1
            headers = [("host", "egress")] + ([("connection", "close")] if last else [])
            sock.sendall(
                (conn.send(h11.Request(method="GET", target=f"/s?id={stream}", headers=headers)))
                + (conn.send(h11.EndOfMessage()) or b"")
            )
            payload = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(262144))
                elif isinstance(event, h11.Response):
                    assert event.status_code == 200, event
                elif isinstance(event, h11.Data):
                    payload += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise AssertionError(f"stream {stream}: {event!r}")
            got[stream] = bytes(payload)
            if not last:
                conn.start_next_cycle()
    finally:
        sock.close()


def read_http10(port: int, stream: int, got: dict[int, bytes]) -> None:
    """One HTTP/1.0 request: the body, close-delimited, goes to ``got``."""
    sock = raw_client(port)
    try:
        sock.sendall(b"GET /s?id=%d HTTP/1.0\r\nHost: egress\r\n\r\n" % stream)
        data = bytearray()
        while chunk := sock.recv(262144):
            data += chunk
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200"), head
        assert b"transfer-encoding" not in head.lower()
        got[stream] = body
    finally:
        sock.close()


def _loops() -> list[object]:
    params: list[object] = [pytest.param(asyncio.run, id="asyncio")]
    try:
        import uvloop

        params.append(pytest.param(uvloop.run, id="uvloop"))
    except ImportError:
        params.append(pytest.param(None, id="uvloop", marks=pytest.mark.skip("no uvloop")))
    return params


@pytest.mark.timeout(60)
@pytest.mark.parametrize("run", _loops())
def test_every_event_arrives_beside_a_stalled_client(run: Callable[..., object]) -> None:
    with Upstream() as upstream, egress(upstream.port, run) as (core, port):
        stalled = raw_client(port, rcvbuf=4096)
        stalled.sendall(b"GET /hold HTTP/1.1\r\nHost: egress\r\n\r\n")
        got: dict[int, bytes] = {}
        readers = [
            threading.Thread(target=read_http11, args=(port, [2 * k, 2 * k + 1], got))
            for k in range(STREAMS_11)
        ]
        http10 = 2 * STREAMS_11
        readers.append(threading.Thread(target=read_http10, args=(port, http10, got)))
        t0 = time.monotonic()
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(40)
        assert not any(r.is_alive() for r in readers), "a reader hung"

        # every byte of every stream, in order, in a complete message
        assert sorted(got) == list(range(http10 + 1))
        for stream, payload in sorted(got.items()):
            expected = events(stream)
            if payload != expected:
                common = next(
                    (i for i, (a, b) in enumerate(zip(payload, expected, strict=False)) if a != b),
                    min(len(payload), len(expected)),
                )
                got_events = payload.count(b"\n\n")
                raise AssertionError(
                    f"stream {stream}: {got_events} of {EVENTS} events, "
                    f"{len(payload)} of {len(expected)} bytes, first difference at {common}"
                )
            assert payload.count(b"\n\n") == EVENTS

        # the neighbour that never read was reset by the stall timeout, its upstream aborted
        t_reset = wait_reset(stalled, timeout_s=STALL_TIMEOUT_S + 15)
        assert socket_error(stalled) == ECONNRESET
        stalled.close()
        assert t_reset - t0 >= STALL_TIMEOUT_S
        deadline = time.monotonic() + 5
        while upstream.outcomes.get("hold") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert upstream.outcomes.get("hold") == "aborted", upstream.outcomes
        sample = core.metrics.registry.get_sample_value
        assert sample("zerowindow_egress_cuts_total", {"reason": "stall_timeout"}) == 1
        assert sample("zerowindow_egress_cuts_total", {"reason": "overflow"}) == 0
        assert sample("zerowindow_egress_upstream_aborts_total", {"reason": "stall_timeout"}) == 1
        for stage in ("connect", "before_response", "mid_stream"):
            assert sample("zerowindow_egress_upstream_errors_total", {"stage": stage}) == 0
        assert sample("zerowindow_egress_requests_total") == 2 * STREAMS_11 + 2
        assert [upstream.outcomes[str(s)] for s in range(http10 + 1)] == ["done"] * (http10 + 1)
