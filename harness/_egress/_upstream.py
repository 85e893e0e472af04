"""The upstream side of one relayed response (``Upstream``, an ``asyncio.BufferedProtocol``).

The upstream connection is an ``asyncio.BufferedProtocol`` (``Upstream``): each read lands
in one buffer per event loop (``READ_CHUNK`` bytes, never more than one byte past the
stream's ``buffer_bytes``) and is handled in the loop's callback, with no stream reader
buffer and no coroutine switch. The response head is parsed with h11 and rewritten for the
client (hop-by-hop fields dropped, ``Connection: close`` when the proxy is closing). A
chunked body going to an HTTP/1.1 client is passed through: every upstream read is written
to the client unchanged, in one write, after httptools (llhttp) has checked its framing
(chunk sizes, CRLFs, the last chunk and the trailer section, forwarded as they came); the
head's h11 parser is dropped then, with the copy of the first read its buffer holds. Other
bodies (``Content-Length``, close-delimited, or chunked to an HTTP/1.0 client) are
re-framed by h11, event by event. A stream holds no memory beyond the bytes its client has
not accepted and a few small objects.

Its faults end the response with ``outcome`` set to the exception; ``_relay.Relay`` decides
what the client gets (a 502 before the head, else an incomplete message).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, cast

import h11
import httptools

from harness._egress._client import READ_CHUNK, Client
from harness._egress._http import UPSTREAM_MAX_HEAD_BYTES, response_headers
from zwcore import ProxyError

if TYPE_CHECKING:
    from harness._egress._relay import Relay

logger = logging.getLogger("zerowindow.egress")

CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
"""Fed to a body's framing checker before the body: the real head was parsed by h11, and
``connection: close`` makes llhttp reject any byte after the end of the body."""


class _End:
    """httptools callbacks of ``valid_prefix``'s parsers."""

    def __init__(self) -> None:
        self.complete = False

    def on_message_complete(self) -> None:
        self.complete = True


def valid_prefix(data: bytes) -> tuple[int, bool]:
    """The length of the longest prefix of ``data`` that is valid chunked framing from a chunk
    boundary on, and whether that prefix ends the body (a binary search with fresh parsers:
    a prefix of a valid prefix is valid; for the rare read with a framing error)."""
    good, bad, complete = 0, len(data), False
    while bad - good > 1:
        mid = (good + bad) // 2
        end = _End()
        parser = httptools.HttpResponseParser(end)
        parser.feed_data(CHUNKED_HEAD)
        try:
            parser.feed_data(data[:mid])
        except httptools.HttpParserError:
            bad = mid
        else:
            good, complete = mid, end.complete
    return good, complete


class UpstreamClosed(ProxyError):
    """The upstream closed its connection before the end of the response.

    Internal: raised in the relay's upstream protocol and caught by ``Relay._relay``, never
    beyond it; a ``zwcore.ProxyError`` like every exception class of the egress buffer."""


class Upstream(asyncio.BufferedProtocol):
    """The upstream connection of one response, relaying it to client ``c`` from the event
    loop's callbacks. Reads land in ``read_buffer`` (shared by the proxy's upstream
    connections: each read is copied out before the callback returns). ``outcome`` resolves
    when the response ended (None), failed (the exception) or stopped because the client's
    connection is closing or closed (None); ``wake`` resolves with ``outcome`` or when
    reading paused on a full buffer (``overflow="pause"``)."""

    def __init__(
        self, relay: Relay, c: Client, request: h11.Request, body: bytes, read_buffer: memoryview
    ) -> None:
        loop = asyncio.get_running_loop()
        self.relay = relay
        self.c = c
        self.method = request.method
        self.read_buffer = read_buffer
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=UPSTREAM_MAX_HEAD_BYTES)
        out = up.send(request) or b""
        if body:
            out += up.send(h11.Data(data=body)) or b""
        self.request = out + (up.send(h11.EndOfMessage()) or b"")  # sent once connected
        self.h11: h11.Connection | None = up  # None once a chunked body is passed through
        self.framing: httptools.HttpResponseParser | None = None  # a chunked body passed through
        self.complete = False
        self.at_boundary = True  # the body so far ends with a whole chunk
        self.started = False  # the response head was sent to the client
        self.paused = False
        self.transport: asyncio.Transport  # set once connected, before any callback
        self.outcome: asyncio.Future[None] = loop.create_future()
        self.wake: asyncio.Future[None] = loop.create_future()

    # ------------------------------------------------------------ asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike
        self.transport = transport = cast(asyncio.Transport, transport)
        transport.write(self.request)  # before any byte can be received: h11's order

    def get_buffer(self, sizehint: int) -> memoryview:
        # never more than one byte past the stream's buffer limit: a cut or pause comes
        # with the buffer at most 1 byte over ``buffer_bytes``
        room = self.relay.config.buffer_bytes - self.c.transport.get_write_buffer_size() + 1
        return self.read_buffer if room >= READ_CHUNK else self.read_buffer[: max(room, 1)]

    def buffer_updated(self, nbytes: int) -> None:
        if self.outcome.done():
            return
        data = bytes(self.read_buffer[:nbytes])
        if self.framing is None:
            self._receive_h11(data)
        else:
            self._pass(data)

    def _pass(self, data: bytes) -> None:
        """One read of a chunked body: checked, then written to the client as it came. Of a
        read with a framing error only the valid part before the error is written, when the
        read began at a chunk boundary (else none of it: the client's message is incomplete
        either way)."""
        assert self.framing is not None
        at_boundary = self.at_boundary
        error: httptools.HttpParserError | None = None
        try:
            self.framing.feed_data(data)
        except httptools.HttpParserError as exc:
            error = exc
            valid, self.complete = valid_prefix(data) if at_boundary else (0, False)
            data = data[:valid]
        c = self.c
        if c.transport.is_closing():  # cut, or the client went away
            self._end(None)
            return
        if data:
            c.write(data)
        if self.complete:  # bytes after the end of the body are ignored, as h11 does
            c.conn.send(h11.EndOfMessage())  # h11's state only: the last chunk was in data
            c.upstream = None
            self._end(None)
        elif error is not None:
            self._end(error)
        else:
            self._check_buffer()

    def on_chunk_header(self) -> None:
        """httptools: a chunk's size line was read."""
        self.at_boundary = False

    def on_chunk_complete(self) -> None:
        """httptools: a chunk and the CRLF after it were read."""
        self.at_boundary = True

    def on_message_complete(self) -> None:
        """httptools: the chunked body ended (its last chunk and trailer section were read)."""
        self.complete = True

    def eof_received(self) -> bool | None:
        if self.outcome.done():
            pass
        elif self.framing is None:
            self._receive_h11(b"")
        else:
            self._end(UpstreamClosed("end of the body missing"))
        return None  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc if exc is not None else UpstreamClosed("connection lost"))

    # ------------------------------------------------------------ relaying

    def _receive_h11(self, data: bytes) -> None:
        """The response head, informational responses and a body h11 re-frames."""
        c, up = self.c, self.h11
        assert up is not None
        try:
            up.receive_data(data)
            while True:
                event = up.next_event()
                if event is h11.NEED_DATA:
                    self._check_buffer()
                    return
                if c.transport.is_closing():  # cut, or the client went away
                    self._end(None)
                    return
                if isinstance(event, h11.Data):
                    c.write(c.conn.send(h11.Data(data=event.data)) or b"")
                elif isinstance(event, h11.Response):
                    self._start(event)
                    if self.framing is not None:
                        body, _ = up.trailing_data
                        self.h11 = None  # and the copy of the read in its buffer with it
                        if body:
                            self._pass(body)
                        return
                elif isinstance(event, h11.EndOfMessage):
                    c.write(c.conn.send(h11.EndOfMessage()) or b"")
                    c.upstream = None
                    self._end(None)
                    return
                elif not isinstance(event, h11.InformationalResponse):
                    # ConnectionClosed before the end of the message
                    raise UpstreamClosed(f"unexpected upstream event {event!r}")
        except (h11.ProtocolError, UpstreamClosed) as exc:
            self._end(exc)

    def _start(self, response: h11.Response) -> None:
        """Send the response head to the client; pass a chunked body through if the client
        takes chunked framing too (HTTP/1.1, a body allowed)."""
        c = self.c
        head = h11.Response(
            status_code=response.status_code,
            headers=response_headers(response, close=self.relay._closing),
            reason=response.reason,
        )
        c.write(c.conn.send(head) or b"")
        self.started = True
        if (
            self.method != b"HEAD"
            and response.status_code not in (204, 304)
            and c.conn.their_http_version == b"1.1"
            and any(n == b"transfer-encoding" for n, _ in response.headers)  # h11: chunked
        ):
            self.framing = httptools.HttpResponseParser(self)
            self.framing.feed_data(CHUNKED_HEAD)

    def _check_buffer(self) -> None:
        c = self.c
        limit = self.relay.config.buffer_bytes
        if c.transport.get_write_buffer_size() <= limit:
            return
        if self.relay._pause:
            if not self.paused:
                self.paused = True
                self.transport.pause_reading()
                self._wake()
        else:
            logger.info("egress: %s buffer over %d bytes: reset", c.peer, limit)
            self.relay._cut(c, "overflow")
            self._end(None)

    def resume(self) -> None:
        """Read the upstream again after a pause (the client's buffer has drained)."""
        self.paused = False
        self.wake = asyncio.get_running_loop().create_future()
        if not self.transport.is_closing():
            self.transport.resume_reading()

    def _end(self, exc: BaseException | None) -> None:
        if self.outcome.done():
            return
        if exc is None:
            self.outcome.set_result(None)
        else:
            self.outcome.set_exception(exc)
        self._wake()

    def _wake(self) -> None:
        if not self.wake.done():
            self.wake.set_result(None)
