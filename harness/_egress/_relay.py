"""The egress buffer's relay: one request forwarded upstream, its response read at full speed
into the client's per-stream buffer and written to the client as fast as its socket accepts.

The client's asyncio transport's write buffer *is* the stream's host-memory buffer: the
transport hands bytes to the kernel as fast as the client's socket accepts them. Above
``EgressConfig.buffer_bytes`` the stream is cut (``overflow="cut"``) or upstream reading
pauses until half of it has drained (``overflow="pause"``).

The upstream side of a response (its connection, the head, passing a chunked body through)
is ``_upstream.Upstream``; this module runs it for one client request and handles its end.

- a client that closes or resets its connection during a response aborts the upstream
  request too (as nginx with ``proxy_ignore_client_abort off``, and uvicorn, do);
- an upstream that fails before its response head gets the client a 502; one that dies or
  sends a malformed body mid-stream gets the client the bytes before the fault (of a read
  with a framing error, the valid part when the read began at a chunk boundary, else none
  of it), then a FIN without the chunked terminator, so the client sees an incomplete
  message (RFC 9112 section 7.1), never a hang or a falsely complete one. Bytes after the
  end of a chunked body are ignored, as h11 ignores them, if their read began at a chunk
  boundary (else the message is left incomplete: the upstream was asked to close).

``Relay`` is a base class of ``_proxy.EgressCore``, which owns the state it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import h11
import httptools

from harness._egress._client import READ_CHUNK, Client
from harness._egress._http import has_body_framing, simple_response, upstream_headers
from harness._egress._upstream import Upstream, UpstreamClosed
from harness._egress._watchdog import StallWatchdog

logger = logging.getLogger("zerowindow.egress")


class Relay(StallWatchdog):
    """Relaying one request and its response for a client connection."""

    _closing: bool
    _pause: bool
    _upstream_host: bytes
    _read_buffer: memoryview | None = None
    """Where upstream reads land (``READ_CHUNK`` bytes, one per event loop)."""

    async def _relay(self, c: Client, request: h11.Request, target: bytes, body: bytes) -> bool:
        """Forward one request and relay its response; True if the connection may be reused."""
        cfg = self.config
        m = self.metrics
        headers = upstream_headers(
            c, request, len(body), host=self._upstream_host, framed=has_body_framing(request)
        )
        if self._read_buffer is None:
            self._read_buffer = memoryview(bytearray(READ_CHUNK))
        forwarded = h11.Request(method=request.method, target=target, headers=headers)
        up = Upstream(self, c, forwarded, body, self._read_buffer)
        try:
            async with asyncio.timeout(cfg.upstream_connect_timeout_s):
                transport, _ = await asyncio.get_running_loop().create_connection(
                    lambda: up, cfg.upstream_host, cfg.upstream_port
                )
        except (OSError, TimeoutError) as exc:
            m.upstream_errors["connect"].inc()
            logger.warning("egress: cannot connect to %s: %r", cfg.upstream_url, exc)
            c.write(simple_response(c.conn, 502, "upstream unreachable", request.method))
            return False
        m.requests.inc()
        m.active_streams.inc()
        c.upstream = transport
        c.peak = 0
        c.client_closed = False
        monitor = asyncio.ensure_future(c.reader.read(READ_CHUNK))
        monitor.add_done_callback(lambda f: self._on_client_read(c, f, up))
        try:
            while not up.outcome.done():
                await up.wake
                if up.paused and not up.outcome.done():
                    await c.writer.drain()
                    up.resume()
            up.outcome.result()
        except (h11.ProtocolError, httptools.HttpParserError, UpstreamClosed, OSError) as exc:
            if c.cut_reason is None and not c.client_closed and not c.transport.is_closing():
                stage = "mid_stream" if up.started else "before_response"
                m.upstream_errors[stage].inc()
                logger.warning("egress: upstream failed (%s) for %s: %r", stage, c.peer, exc)
                if not up.started:
                    c.write(simple_response(c.conn, 502, "upstream failed", request.method))
            return False
        finally:
            if not monitor.done():
                monitor.cancel()  # the read must be over before the next one starts
                with contextlib.suppress(asyncio.CancelledError):
                    await monitor
            if c.upstream is not None:  # the response did not end: abort the request
                self._abort_upstream(c, "client_closed" if c.client_closed else "shutdown")
            transport.close()
            await self._flush(c)
            m.active_streams.dec()
            m.stream_peak_buffered.observe(c.peak)
        return not (c.client_closed or c.transport.is_closing()) and c.cut_reason is None

    def _on_client_read(self, c: Client, fut: asyncio.Future[bytes], up: Upstream) -> None:
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
        up._end(None)

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
