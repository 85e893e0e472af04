"""The egress buffer's engine: an asyncio reverse proxy with a write-stall watchdog.

One coroutine per client connection parses requests with h11 (HTTP/1.1, RFC 9112), opens a
fresh connection to the configured upstream for each request (``Connection: close``; the
proxy never connects anywhere else, whatever the request target or ``Host`` say), and
relays the response:

- the upstream response is read as fast as it arrives and written to the client's asyncio
  transport, whose write buffer *is* the stream's host-memory buffer: the transport hands
  bytes to the kernel as fast as the client's socket accepts them. Above
  ``EgressConfig.buffer_bytes`` the stream is cut (``overflow="cut"``) or upstream reading
  pauses until half of it has drained (``overflow="pause"``);
- one watchdog task ticks every ``tick_s`` (0.1 s, or ``stall_timeout_s / 10`` if smaller)
  and measures each client's write progress: bytes accepted by the kernel = bytes written
  to the transport - bytes still in its buffer. A connection with bytes pending whose
  socket accepted none for ``stall_timeout_s`` is reset: ``SO_LINGER`` {on, 0} then close
  sends a TCP RST instead of a FIN (tcp(7), socket(7) ``SO_LINGER``), and its upstream
  connection is closed so that the engine aborts the request;
- a client that closes or resets its connection during a response aborts the upstream
  request too (as nginx with ``proxy_ignore_client_abort off``, and uvicorn, do);
- an upstream that fails before its response head gets the client a 502; one that dies or
  sends a malformed body mid-stream gets the client what was buffered, then a FIN without
  the chunked terminator, so the client sees an incomplete message (RFC 9112 section 7.1),
  never a hang or a falsely complete one.

Limits: request head (``max_header_bytes``, 431, enforced by h11's
``max_incomplete_event_size`` so a slow or endless head never grows memory past it), body
(``max_body_bytes``, 413), concurrent connections (``max_connections``, 503), head within
``header_timeout_s`` (408, then close). Hop-by-hop header fields (RFC 9110 section 7.6.1)
are not forwarded.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time
from collections.abc import Callable, Iterable
from urllib.parse import urlsplit

import h11

from harness._egress._config import EgressConfig
from harness._egress._metrics import CONTENT_TYPE, EgressMetrics

logger = logging.getLogger("zerowindow.egress")

READ_CHUNK = 64 * 1024
"""Bytes per read from either side."""
UPSTREAM_MAX_HEAD_BYTES = 64 * 1024
"""Largest upstream response head accepted; a larger one is an upstream error (502)."""
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024
"""After an error response, the request bytes still arriving are read and discarded for at
most this long / this much before closing, so the response is not lost to a RST (closing a
socket with unread data resets it)."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""RFC 9110 section 7.6.1 plus the legacy ``keep-alive`` and ``proxy-connection``."""

_REASONS = {
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
}


def reset_connection(transport: asyncio.WriteTransport) -> None:
    """Close ``transport`` abortively: the peer receives a TCP RST, not a FIN.

    Sets ``SO_LINGER`` to {l_onoff=1, l_linger=0} (``struct linger`` of two ints, socket(7)),
    which makes close(2) discard unsent data and send a RST (tcp(7)), then aborts the
    transport (the event loop closes the socket on its next iteration).
    """
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class _Client:
    """One client connection: its streams, h11 state and write-progress bookkeeping."""

    __slots__ = (
        "reader",
        "writer",
        "transport",
        "conn",
        "task",
        "peer",
        "written",
        "last_sent",
        "last_progress",
        "stall_start",
        "cut_reason",
        "upstream",
        "client_closed",
        "idle",
        "peak",
    )

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_header_bytes: int,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.transport = writer.transport
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.written = 0  # bytes handed to the transport
        self.last_sent = 0  # bytes accepted by the kernel at the last watchdog tick
        self.last_progress = time.monotonic()
        self.stall_start: float | None = None
        self.cut_reason: str | None = None
        self.upstream: asyncio.WriteTransport | None = None  # while a response is unfinished
        self.client_closed = False
        self.idle = True  # waiting for the first byte of a request
        self.peak = 0

    def write(self, data: bytes) -> None:
        """Hand ``data`` to the transport (no-op once the connection is closing)."""
        if self.transport.is_closing():
            return
        self.transport.write(data)
        self.written += len(data)
        size = self.transport.get_write_buffer_size()
        if size > self.peak:
            self.peak = size


class _Refused(Exception):
    """The request was answered with an error status by the proxy itself."""

    def __init__(self, status: int, reason: str, *, linger: bool = True) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.linger = linger


class EgressCore:
    """The proxy's state and coroutines, run in one event loop by ``EgressProxy``/``serve``.

    ``metrics`` holds the Prometheus metrics (``_metrics.EgressMetrics``); ``tick_s`` is the
    watchdog's period in seconds.
    """

    def __init__(self, config: EgressConfig) -> None:
        self.config = config
        self._clients: set[_Client] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.metrics = EgressMetrics(
            buffered_bytes=self._buffered_bytes, connections=lambda: len(self._clients)
        )
        self.tick_s = min(0.1, config.stall_timeout_s / 10)
        authority = config.upstream_authority.encode("ascii")
        self._upstream_host = authority
        self._pause = config.overflow == "pause"

    def _buffered_bytes(self) -> int:
        total = 0
        for c in list(self._clients):
            total += c.transport.get_write_buffer_size()
        return total

    # ----------------------------------------------------------------- lifecycle

    async def run(
        self,
        listen_sock: socket.socket,
        metrics_sock: socket.socket | None,
        *,
        stop: asyncio.Event,
        on_started: Callable[[], None] | None = None,
    ) -> None:
        """Serve on the given listening sockets until ``stop`` is set, then shut down.

        Shutdown stops accepting, closes idle connections, lets streams in progress finish
        for ``shutdown_timeout_s`` seconds, then closes the rest (aborting their upstream
        requests). ``on_started`` is called once both listeners accept.
        """
        server = await asyncio.start_server(
            self._on_client, sock=listen_sock, limit=READ_CHUNK, backlog=1024
        )
        metrics_server = None
        if metrics_sock is not None:
            metrics_server = await asyncio.start_server(self._on_metrics, sock=metrics_sock)
        watchdog = asyncio.create_task(self._watchdog(), name="egress-watchdog")
        if on_started is not None:
            on_started()
        try:
            await stop.wait()
        finally:
            server.close()
            if metrics_server is not None:
                metrics_server.close()
            await self._shutdown()
            watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watchdog

    async def _shutdown(self) -> None:
        self._closing = True
        for c in list(self._clients):
            if c.idle and c.task is not None:
                c.task.cancel()
        pending = set(self._tasks)
        if pending:
            _, pending = await asyncio.wait(pending, timeout=self.config.shutdown_timeout_s)
        if not pending:
            return
        for c in list(self._clients):  # grace period over: close what is left
            self._abort_upstream(c, "shutdown")
            c.transport.abort()
        _, pending = await asyncio.wait(pending, timeout=1.0)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)

    # ----------------------------------------------------------------- watchdog

    async def _watchdog(self) -> None:
        timeout = self.config.stall_timeout_s
        m = self.metrics
        while True:
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            for c in list(self._clients):
                size = c.transport.get_write_buffer_size()
                sent = c.written - size
                if size == 0 or sent != c.last_sent:
                    c.last_sent = sent
                    c.last_progress = now
                    if c.stall_start is not None:
                        m.stall_duration.observe(now - c.stall_start)
                        c.stall_start = None
                    continue
                if c.cut_reason is not None:
                    continue
                if c.stall_start is None:
                    c.stall_start = c.last_progress
                    m.stalls.inc()
                if now - c.last_progress >= timeout:
                    m.stall_duration.observe(now - c.stall_start)
                    c.stall_start = None
                    logger.info(
                        "egress: %s accepted no byte for %.2f s with %d bytes pending: reset",
                        c.peer,
                        now - c.last_progress,
                        size,
                    )
                    self._cut(c, "stall_timeout")

    def _cut(self, c: _Client, reason: str) -> None:
        """Reset the client (RST) and abort its upstream request; counted once."""
        if c.cut_reason is not None:
            return
        c.cut_reason = reason
        self.metrics.cuts[reason].inc()
        reset_connection(c.transport)
        self._abort_upstream(c, reason)

    def _abort_upstream(self, c: _Client, reason: str) -> None:
        upstream, c.upstream = c.upstream, None
        if upstream is not None and not upstream.is_closing():
            upstream.abort()
            self.metrics.upstream_aborts[reason].inc()

    # ----------------------------------------------------------------- clients

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._closing or len(self._clients) >= self.config.max_connections:
                self.metrics.rejected["too_many_connections"].inc()
                conn = h11.Connection(h11.SERVER)
                writer.write(_simple_response(conn, 503, "too many connections"))
                await _linger_close(reader, writer)
                return
            sndbuf = self.config.client_sndbuf_bytes
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP,
                    # and socket.create_server's (and so accepted ones) have proto 0: without
                    # it, Nagle holds a response body until the client's delayed ACK (40 ms)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                    if sndbuf is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
            high = self.config.buffer_bytes
            writer.transport.set_write_buffer_limits(high=high, low=high // 2)
            c = _Client(reader, writer, max_header_bytes=self.config.max_header_bytes)
            self._clients.add(c)
            try:
                await self._serve(c)
            except asyncio.CancelledError:
                pass  # shutdown
            except Exception:
                logger.exception("egress: unexpected error on %s", c.peer)
            finally:
                self._abort_upstream(c, "shutdown" if self._closing else "client_closed")
                self._clients.discard(c)
                if c.stall_start is not None:  # a stall ended by the connection's end
                    self.metrics.stall_duration.observe(time.monotonic() - c.stall_start)
                if not c.transport.is_closing():
                    c.transport.abort()
        finally:
            self._tasks.discard(task)

    async def _serve(self, c: _Client) -> None:
        """Requests of one connection, one after another, until it closes."""
        first = True
        while not self._closing:
            c.idle = True
            try:
                request, body = await self._read_request(c, first=first)
            except _Refused as refused:
                self.metrics.rejected[refused.reason].inc()
                if c.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    c.write(_simple_response(c.conn, refused.status, refused.reason))
                if refused.linger:
                    c.idle = True  # shutdown need not wait for it
                    await _linger_close(c.reader, c.writer)
                else:
                    c.writer.close()
                return
            if request is None:
                return
            first = False
            target = _upstream_target(request)
            if target is None:
                self.metrics.rejected["bad_request"].inc()
                status = 405 if request.method == b"CONNECT" else 400
                c.write(_simple_response(c.conn, status, "bad request", request.method))
                c.idle = True
                await _linger_close(c.reader, c.writer)
                return
            keep = await self._relay(c, request, target, body)
            if not keep or self._closing:
                await self._flush(c)
                if not c.transport.is_closing():
                    c.transport.close()
                return
            try:
                c.conn.start_next_cycle()
            except h11.LocalProtocolError:
                await self._flush(c)
                c.transport.close()
                return

    async def _read_request(self, c: _Client, *, first: bool) -> tuple[h11.Request | None, bytes]:
        """The next request and its whole body; (None, b"") if the client closed, idled out
        or sent something unanswerable. Raises ``_Refused`` for a request the proxy answers
        itself (408, 413, 431, 400)."""
        cfg = self.config
        conn = c.conn
        loop = asyncio.get_running_loop()
        eof = False
        deadline = loop.time() + cfg.header_timeout_s
        try:
            event = conn.next_event()  # a pipelined request may be buffered already
            if event is h11.NEED_DATA:
                # the first request's head is due header_timeout_s after the accept
                wait_s = cfg.header_timeout_s if first else cfg.keepalive_timeout_s
                try:
                    async with asyncio.timeout(wait_s):
                        data = await c.reader.read(READ_CHUNK)
                except TimeoutError:
                    if first:
                        raise _Refused(408, "header_timeout", linger=False) from None
                    return None, b""
                if not data:
                    return None, b""
                if not first:
                    deadline = loop.time() + cfg.header_timeout_s
                c.idle = False
                conn.receive_data(data)
                event = conn.next_event()
            c.idle = False
            async with asyncio.timeout_at(deadline if event is h11.NEED_DATA else None):
                while event is h11.NEED_DATA:
                    data = await c.reader.read(READ_CHUNK)
                    eof = not data
                    conn.receive_data(data)
                    event = conn.next_event()
        except TimeoutError:
            raise _Refused(408, "header_timeout", linger=False) from None
        except h11.RemoteProtocolError as exc:
            if exc.error_status_hint == 431:
                raise _Refused(431, "header_too_large") from None
            if eof:
                return None, b""  # closed in the middle of a head: nobody to answer
            raise _Refused(400, "bad_request") from None
        except OSError:
            return None, b""
        if isinstance(event, h11.ConnectionClosed):
            return None, b""
        if not isinstance(event, h11.Request):
            raise _Refused(400, "bad_request")
        request = event
        length = _content_length(request)
        if length is not None and length > cfg.max_body_bytes:
            raise _Refused(413, "body_too_large")
        body = bytearray()
        try:
            async with asyncio.timeout(cfg.body_timeout_s):
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        if conn.they_are_waiting_for_100_continue:
                            c.write(
                                conn.send(h11.InformationalResponse(status_code=100, headers=[]))
                                or b""
                            )
                        conn.receive_data(await c.reader.read(READ_CHUNK))
                        continue
                    if isinstance(event, h11.Data):
                        body += event.data
                        if len(body) > cfg.max_body_bytes:
                            raise _Refused(413, "body_too_large")
                        continue
                    if isinstance(event, h11.EndOfMessage):
                        break
                    return None, b""  # ConnectionClosed mid-body
        except TimeoutError:
            raise _Refused(408, "body_timeout", linger=False) from None
        except (h11.RemoteProtocolError, OSError):
            return None, b""
        return request, bytes(body)

    # ----------------------------------------------------------------- relay

    async def _relay(self, c: _Client, request: h11.Request, target: bytes, body: bytes) -> bool:
        """Forward one request and relay its response; True if the connection may be reused."""
        cfg = self.config
        m = self.metrics
        try:
            async with asyncio.timeout(cfg.upstream_connect_timeout_s):
                ureader, uwriter = await asyncio.open_connection(
                    cfg.upstream_host, cfg.upstream_port, limit=READ_CHUNK
                )
        except (OSError, TimeoutError) as exc:
            m.upstream_errors["connect"].inc()
            logger.warning("egress: cannot connect to %s: %r", cfg.upstream_url, exc)
            c.write(_simple_response(c.conn, 502, "upstream unreachable", request.method))
            return False
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=UPSTREAM_MAX_HEAD_BYTES)
        headers = self._upstream_headers(c, request, len(body), framed=_has_body_framing(request))
        out = up.send(h11.Request(method=request.method, target=target, headers=headers)) or b""
        if body:
            out += up.send(h11.Data(data=body)) or b""
        out += up.send(h11.EndOfMessage()) or b""
        uwriter.write(out)
        m.requests.inc()
        m.active_streams.inc()
        c.upstream = uwriter.transport
        c.peak = 0
        c.client_closed = False
        monitor = asyncio.ensure_future(c.reader.read(READ_CHUNK))
        monitor.add_done_callback(lambda f: self._on_client_read(c, f))
        started = False
        limit = cfg.buffer_bytes
        try:
            while True:
                event = up.next_event()
                if event is h11.NEED_DATA:
                    up.receive_data(await ureader.read(READ_CHUNK))
                    continue
                if c.transport.is_closing():
                    break  # cut, or the client went away
                if isinstance(event, h11.Data):
                    c.write(c.conn.send(h11.Data(data=event.data)) or b"")
                elif isinstance(event, h11.Response):
                    head = h11.Response(
                        status_code=event.status_code,
                        headers=_response_headers(event, close=self._closing),
                        reason=event.reason,
                    )
                    c.write(c.conn.send(head) or b"")
                    started = True
                elif isinstance(event, h11.EndOfMessage):
                    c.upstream = None
                    c.write(c.conn.send(h11.EndOfMessage()) or b"")
                    break
                elif isinstance(event, h11.InformationalResponse):
                    continue
                else:  # ConnectionClosed before the end of the message, PAUSED
                    raise h11.RemoteProtocolError(f"unexpected upstream event {event!r}")
                if c.transport.get_write_buffer_size() > limit:
                    if self._pause:
                        await c.writer.drain()
                    else:
                        logger.info("egress: %s buffer over %d bytes: reset", c.peer, limit)
                        self._cut(c, "overflow")
                        break
        except (h11.ProtocolError, OSError) as exc:
            if c.cut_reason is None and not c.client_closed and not c.transport.is_closing():
                stage = "mid_stream" if started else "before_response"
                m.upstream_errors[stage].inc()
                logger.warning("egress: upstream failed (%s) for %s: %r", stage, c.peer, exc)
                if not started:
                    c.write(_simple_response(c.conn, 502, "upstream failed", request.method))
            return False
        finally:
            if not monitor.done():
                monitor.cancel()  # the read must be over before the next one starts
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
            if c.upstream is not None:  # the response did not end: abort the request
                self._abort_upstream(c, "client_closed" if c.client_closed else "shutdown")
            uwriter.close()
            await self._flush(c)
            m.active_streams.dec()
            m.stream_peak_buffered.observe(c.peak)
        return not (c.client_closed or c.transport.is_closing()) and c.cut_reason is None

    def _on_client_read(self, c: _Client, fut: asyncio.Future[bytes]) -> None:
        """The client sent bytes or went away during a response."""
        if fut.cancelled():
            return
        exc = fut.exception()
        data = b"" if exc is not None else fut.result()
        if data:
            c.conn.receive_data(data)  # a pipelined request: kept for the next cycle
            return
        c.client_closed = True
        if c.upstream is not None:
            logger.info("egress: %s closed its connection mid-response: abort", c.peer)
            self._abort_upstream(c, "client_closed")

    async def _flush(self, c: _Client) -> None:
        """Wait until the transport's buffer is empty or the connection is gone; the
        watchdog keeps watching (a stalled client is reset)."""
        transport = c.transport
        if transport.is_closing() or transport.get_write_buffer_size() == 0:
            return
        high = self.config.buffer_bytes
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            await c.writer.drain()
        except (OSError, RuntimeError):
            pass
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=high // 2)

    def _upstream_headers(
        self, c: _Client, request: h11.Request, body_len: int, *, framed: bool
    ) -> list[tuple[bytes, bytes]]:
        drop = HOP_BY_HOP | _connection_tokens(request.headers)
        drop |= {b"host", b"content-length", b"expect"}
        headers = [(b"host", self._upstream_host)]
        headers += [(n, v) for n, v in request.headers if n not in drop]
        peer = c.writer.get_extra_info("peername")
        if isinstance(peer, tuple):
            headers.append((b"x-forwarded-for", str(peer[0]).encode()))
        if framed or body_len:
            headers.append((b"content-length", str(body_len).encode()))
        headers.append((b"connection", b"close"))
        return headers

    # ----------------------------------------------------------------- metrics listener

    async def _on_metrics(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=8192)
        try:
            async with asyncio.timeout(5.0):
                event = conn.next_event()
                while event is h11.NEED_DATA:
                    conn.receive_data(await reader.read(8192))
                    event = conn.next_event()
                if not isinstance(event, h11.Request):
                    return
                if event.method != b"GET":
                    writer.write(_simple_response(conn, 405, "GET only"))
                elif event.target.split(b"?", 1)[0] != b"/metrics":
                    writer.write(_simple_response(conn, 404, "see /metrics"))
                else:
                    body = self.metrics.render()
                    head = h11.Response(
                        status_code=200,
                        headers=[
                            (b"content-type", CONTENT_TYPE.encode()),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close"),
                        ],
                    )
                    writer.write(
                        (conn.send(head) or b"")
                        + (conn.send(h11.Data(data=body)) or b"")
                        + (conn.send(h11.EndOfMessage()) or b"")
                    )
                await writer.drain()
        except (TimeoutError, h11.ProtocolError, OSError):
            pass
        finally:
            writer.close()


# --------------------------------------------------------------------- helpers


def _simple_response(
    conn: h11.Connection, status: int, text: str, method: bytes | None = None
) -> bytes:
    """A complete ``Connection: close`` response with a short text body (none to a HEAD
    request, whose ``method`` is given); b"" if h11's state allows no response."""
    body = (text + "\n").encode()
    head = h11.Response(
        status_code=status,
        reason=_REASONS.get(status, b""),
        headers=[
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    )
    try:
        out = conn.send(head) or b""
        if method != b"HEAD":
            out += conn.send(h11.Data(data=body)) or b""
        return out + (conn.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return b""


async def _linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send FIN after the pending response, discard what the client still sends for a
    short while, then close (an error response is not lost to a RST)."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            received = 0
            while received < LINGER_BYTES:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                received += len(data)
    except (TimeoutError, OSError, RuntimeError):
        pass
    finally:
        writer.close()


def _connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Field names listed in ``Connection`` (hop-by-hop too, RFC 9110 section 7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def _content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 validated it
    return None


def _has_body_framing(request: h11.Request) -> bool:
    return any(n in (b"content-length", b"transfer-encoding") for n, _ in request.headers)


def _response_headers(response: h11.Response, *, close: bool) -> list[tuple[bytes, bytes]]:
    """Upstream response fields minus hop-by-hop ones; h11 re-frames the body for the
    client (``Content-Length`` kept, otherwise chunked or close-delimited)."""
    drop = HOP_BY_HOP | _connection_tokens(response.headers)
    headers = [(n, v) for n, v in response.headers if n not in drop]
    if close:
        headers.append((b"connection", b"close"))
    return headers


def _upstream_target(request: h11.Request) -> bytes | None:
    """The request target to send upstream (origin-form), or None if it cannot be proxied.

    origin-form and ``*`` (OPTIONS) pass unchanged; absolute-form keeps only its path and
    query (RFC 9112 section 3.2.2: the authority in it is not used, the configured upstream
    is); authority-form (CONNECT) is refused: this is not a forward proxy.
    """
    target = request.target
    if request.method == b"CONNECT":
        return None
    if target.startswith(b"/") or (target == b"*" and request.method == b"OPTIONS"):
        return target
    lowered = target[:8].lower()
    if lowered.startswith((b"http://", b"https://")):
        parts = urlsplit(target.decode("ascii", "replace"))
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return path.encode("ascii", "replace")
    return None
