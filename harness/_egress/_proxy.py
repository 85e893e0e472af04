"""The egress buffer's engine: an asyncio reverse proxy with a stall watchdog.

One coroutine per client connection parses requests with h11 (HTTP/1.1, RFC 9112; see
``_http``), opens a fresh connection to the configured upstream for each request
(``Connection: close``; the proxy never connects anywhere else, whatever the request target
or ``Host`` say), and relays the response (``_relay``). One watchdog task resets clients that
acknowledge nothing for ``stall_timeout_s`` while they owe bytes (``_watchdog``). Prometheus
metrics are served on a separate listener (``_metrics_endpoint``); with ``clients_log``, each
connection's delivery record is appended to that file when it ends.

This module holds the proxy's state and its life cycle: listening, accepting (at most
``max_connections``, else 503), the requests of one connection one after another, and the
graceful shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import socket
import time
from collections.abc import Callable

import h11

from harness._egress._client import READ_CHUNK, Client, linger_close
from harness._egress._config import EgressConfig
from harness._egress._http import Refused, read_request, simple_response, upstream_target
from harness._egress._metrics import EgressMetrics
from harness._egress._metrics_endpoint import serve_scrape
from harness._egress._relay import Relay
from harness._egress._watchdog import delivery

logger = logging.getLogger("zerowindow.egress")


class EgressCore(Relay):
    """The proxy's state and coroutines, run in one event loop by ``EgressProxy``/``serve``.

    ``metrics`` holds the Prometheus metrics (``_metrics.EgressMetrics``); ``tick_s`` is the
    watchdog's period in seconds.
    """

    def __init__(self, config: EgressConfig) -> None:
        self.config = config
        self._clients: set[Client] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self.metrics = EgressMetrics(
            buffered_bytes=self._buffered_bytes, connections=lambda: len(self._clients)
        )
        self.tick_s = min(0.1, config.stall_timeout_s / 10)
        authority = config.upstream_authority.encode("ascii")
        self._upstream_host = authority
        self._pause = config.overflow == "pause"
        self._clients_log = (
            open(config.clients_log, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
            if config.clients_log
            else None
        )

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
            metrics_server = await asyncio.start_server(
                functools.partial(serve_scrape, self.metrics), sock=metrics_sock
            )
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
            if self._clients_log is not None:
                self._clients_log.close()

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

    # ----------------------------------------------------------------- clients

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            if self._closing or len(self._clients) >= self.config.max_connections:
                self.metrics.rejected["too_many_connections"].inc()
                conn = h11.Connection(h11.SERVER)
                writer.write(simple_response(conn, 503, "too many connections"))
                await linger_close(reader, writer)
                return
            sndbuf = self.config.client_sndbuf_bytes
            lowat = self.config.client_notsent_lowat_bytes
            sock = writer.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    # asyncio sets TCP_NODELAY only on sockets whose proto is IPPROTO_TCP,
                    # and socket.create_server's (and so accepted ones) have proto 0: without
                    # it (client_tcp_nodelay = false), Nagle held a response body until the
                    # client's delayed ACK (40 ms)
                    nodelay = int(self.config.client_tcp_nodelay)
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, nodelay)
                    if sndbuf is not None:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
                    if lowat is not None:
                        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NOTSENT_LOWAT, lowat)
            high = self.config.buffer_bytes
            writer.transport.set_write_buffer_limits(high=high, low=high // 2)
            c = Client(reader, writer, max_header_bytes=self.config.max_header_bytes)
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
                if self._clients_log is not None:
                    final = delivery(c.sock)  # as it ends, if still known
                    c.acked = final[0] if final is not None else c.acked
                    self._clients_log.write(json.dumps(c.record()) + "\n")
                if not c.transport.is_closing():
                    c.transport.abort()
        finally:
            self._tasks.discard(task)

    async def _serve(self, c: Client) -> None:
        """Requests of one connection, one after another, until it closes."""
        first = True
        while not self._closing:
            c.idle = True
            try:
                request, body = await read_request(c, self.config, first=first)
            except Refused as refused:
                self.metrics.rejected[refused.reason].inc()
                if c.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                    c.write(simple_response(c.conn, refused.status, refused.reason))
                if refused.linger:
                    c.idle = True  # shutdown need not wait for it
                    await linger_close(c.reader, c.writer)
                else:
                    c.writer.close()
                return
            if request is None:
                return
            first = False
            target = upstream_target(request)
            if target is None:
                self.metrics.rejected["bad_request"].inc()
                status = 405 if request.method == b"CONNECT" else 400
                c.write(simple_response(c.conn, status, "bad request", request.method))
                c.idle = True
                await linger_close(c.reader, c.writer)
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
