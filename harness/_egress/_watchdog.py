"""The egress buffer's stall watchdog: a stall is no delivery progress, and cutting a client with
a RST.

One task ticks every ``tick_s`` (0.1 s, or ``stall_timeout_s / 10`` if smaller), or sooner when
a stalled client's time is up. A client
owes bytes while fewer bytes have been acknowledged by it than the proxy wrote for it; for
such a client it reads ``tcpi_bytes_acked`` from ``TCP_INFO`` (the bytes the peer has
acknowledged, RFC 4898's tcpEStatsAppHCThruOctetsAcked; ``struct tcp_info`` in
``include/uapi/linux/tcp.h``, Linux 4.1 and later; tcp(7)). A client that acknowledged nothing
new for ``stall_timeout_s`` while it owed bytes is stalled, whatever its send buffer holds
(progress is dated by the ACK that brought it, ``tcpi_last_ack_recv``; owing is seen within a
tick of the write that began it): a slow reader behind a slow link still acknowledges and is
never cut, and a stalled one is cut after the same time whether its send buffer is 4 KiB or
1 MiB. It is reset: ``SO_LINGER``
{on, 0} then close sends a TCP RST instead of a FIN (tcp(7), socket(7) ``SO_LINGER``), and its
upstream connection is closed so that the engine aborts the request.

``StallWatchdog`` is a base class of ``_proxy.EgressCore``, which owns the state it reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
import time

from harness._egress._client import ACKED_SAMPLE_S, MAX_ACKED_SAMPLES, Client
from harness._egress._config import EgressConfig
from harness._egress._metrics import EgressMetrics

logger = logging.getLogger("zerowindow.egress")


_TCP_INFO_LEN = 128
# Fields of struct tcp_info (include/uapi/linux/tcp.h) at their offsets: __u32
# tcpi_last_ack_recv (ms since the last ACK came in) and __u64 tcpi_bytes_acked.
_LAST_ACK_RECV = struct.Struct("=I")
_LAST_ACK_RECV_OFFSET = 56
_BYTES_ACKED = struct.Struct("=Q")
_BYTES_ACKED_OFFSET = 120


def delivery(sock: socket.socket | None) -> tuple[int, float] | None:
    """(bytes the peer of TCP socket ``sock`` has acknowledged, seconds since its last ACK
    came in): ``tcpi_bytes_acked`` and ``tcpi_last_ack_recv`` (see the module docstring);
    ``None`` for a closed socket or a kernel without them."""
    if sock is None:
        return None
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
    except (OSError, ValueError):  # closed (uvloop's socket then has no descriptor: -1)
        return None
    if len(info) < _TCP_INFO_LEN:
        return None
    acked = int(_BYTES_ACKED.unpack_from(info, _BYTES_ACKED_OFFSET)[0])
    return acked, _LAST_ACK_RECV.unpack_from(info, _LAST_ACK_RECV_OFFSET)[0] / 1000.0


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
        wake = self.tick_s
        while True:
            await asyncio.sleep(wake)
            now = time.monotonic()
            wake = self.tick_s  # or sooner, to cut a stalled client when its time is up
            for c in list(self._clients):
                if c.cut_reason is not None:
                    continue
                checked, c.checked = c.checked, now
                if c.acked >= c.written:  # nothing owed
                    self._progress(c, now)
                    continue
                seen = delivery(c.sock)
                if seen is None:  # the connection is gone: its task ends it
                    continue
                acked, since_ack_s = seen
                if acked != c.acked:  # it grew, with an ACK after the last check
                    c.acked = acked
                    samples = c.acked_over_time
                    if len(samples) < MAX_ACKED_SAMPLES and (
                        not samples or now - samples[-1][0] >= ACKED_SAMPLE_S
                    ):
                        samples.append((now, acked))
                    self._progress(c, max(checked, now - since_ack_s))
                    continue
                if c.stall_start is None:
                    c.stall_start = c.last_progress
                    m.stalls.inc()
                if now - c.last_progress < timeout:
                    wake = min(wake, c.last_progress + timeout - now)
                else:
                    m.stall_duration.observe(now - c.stall_start)
                    c.stall_start = None
                    logger.info(
                        "egress: %s acknowledged no byte for %.2f s with %d bytes owed: reset",
                        c.peer,
                        now - c.last_progress,
                        c.written - c.acked,
                    )
                    self._cut(c, "stall_timeout")

    def _progress(self, c: Client, when: float) -> None:
        """``c`` made delivery progress at ``when`` (monotonic s): a stall, if any, ends."""
        c.last_progress = when
        if c.stall_start is not None:
            self.metrics.stall_duration.observe(when - c.stall_start)
            c.stall_start = None

    def _cut(self, c: Client, reason: str) -> None:
        """Reset the client (RST) and abort its upstream request; counted once."""
        if c.cut_reason is not None:
            return
        c.cut_reason = reason
        c.t_cut = time.monotonic()
        self.metrics.cuts[reason].inc()
        reset_connection(c.transport)
        self._abort_upstream(c, reason)

    def _abort_upstream(self, c: Client, reason: str) -> None:
        upstream, c.upstream = c.upstream, None
        if upstream is not None and not upstream.is_closing():
            upstream.abort()
            self.metrics.upstream_aborts[reason].inc()
