"""The egress buffer's relay: one request forwarded upstream, its response read at full speed
into the client's per-stream buffer and written to the client as fast as its socket accepts.

The client's asyncio transport's write buffer *is* the stream's host-memory buffer: the
transport hands bytes to the kernel as fast as the client's socket accepts them. Above
``EgressConfig.buffer_bytes`` the stream is cut (``overflow="cut"``) or upstream reading
pauses until half of it has drained (``overflow="pause"``).

- a client that closes or resets its connection during a response aborts the upstream
  request too (as nginx with ``proxy_ignore_client_abort off``, and uvicorn, do);
- an upstream that fails before its response head gets the client a 502; one that dies or
  sends a malformed body mid-stream gets the client what was buffered, then a FIN without
  the chunked terminator, so the client sees an incomplete message (RFC 9112 section 7.1),
  never a hang or a falsely complete one.

``Relay`` is a base class of ``_proxy.EgressCore``, which owns the state it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import h11

from harness._egress._client import READ_CHUNK, Client
from harness._egress._http import (
    UPSTREAM_MAX_HEAD_BYTES,
    has_body_framing,
    response_headers,
    simple_response,
    upstream_headers,
)
from harness._egress._watchdog import StallWatchdog

logger = logging.getLogger("zerowindow.egress")


class Relay(StallWatchdog):
    """Relaying one request and its response for a client connection."""

    _closing: bool
    _pause: bool
    _upstream_host: bytes

    async def _relay(self, c: Client, request: h11.Request, target: bytes, body: bytes) -> bool:
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
            c.write(simple_response(c.conn, 502, "upstream unreachable", request.method))
            return False
        up = h11.Connection(h11.CLIENT, max_incomplete_event_size=UPSTREAM_MAX_HEAD_BYTES)
        headers = upstream_headers(
            c, request, len(body), host=self._upstream_host, framed=has_body_framing(request)
        )
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
                        headers=response_headers(event, close=self._closing),
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
                    c.write(simple_response(c.conn, 502, "upstream failed", request.method))
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

    def _on_client_read(self, c: Client, fut: asyncio.Future[bytes]) -> None:
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

    async def _flush(self, c: Client) -> None:
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
