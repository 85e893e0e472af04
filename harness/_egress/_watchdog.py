"""The egress buffer's stall watchdog: write-stall timeout, and cutting a client with a RST.

One task ticks every ``tick_s`` (0.1 s, or ``stall_timeout_s / 10`` if smaller) and measures
each client's write progress: bytes accepted by the kernel = bytes written to the transport -
bytes still in its buffer. A connection with bytes pending whose socket accepted none for
``stall_timeout_s`` is reset: ``SO_LINGER`` {on, 0} then close sends a TCP RST instead of a
FIN (tcp(7), socket(7) ``SO_LINGER``), and its upstream connection is closed so that the
engine aborts the request.

``StallWatchdog`` is a base class of ``_proxy.EgressCore``, which owns the state it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time

from harness._egress._client import Client
from harness._egress._config import EgressConfig
from harness._egress._metrics import EgressMetrics

logger = logging.getLogger("zerowindow.egress")


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


class StallWatchdog:
    """The watchdog loop and the two ways the proxy ends a client's stream early: cutting the
    client (RST) and aborting its upstream request. Counted in ``metrics``."""

    config: EgressConfig
    metrics: EgressMetrics
    tick_s: float
    """The watchdog's period in seconds."""
    _clients: set[Client]

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

    def _cut(self, c: Client, reason: str) -> None:
        """Reset the client (RST) and abort its upstream request; counted once."""
        if c.cut_reason is not None:
            return
        c.cut_reason = reason
        self.metrics.cuts[reason].inc()
        reset_connection(c.transport)
        self._abort_upstream(c, reason)

    def _abort_upstream(self, c: Client, reason: str) -> None:
        upstream, c.upstream = c.upstream, None
        if upstream is not None and not upstream.is_closing():
            upstream.abort()
            self.metrics.upstream_aborts[reason].inc()
