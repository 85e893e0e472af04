"""Has a response left the server? Watching one TCP connection until its bytes are acked.

This is what couples KV to the socket in ``kv_release="on_delivery"``: a finished request
keeps its KV blocks until every byte written for it has left both the asyncio transport's
write buffer (user space, where uvicorn's flow control pauses the ASGI ``send`` above the
high-water mark) and the kernel send queue, i.e. was acknowledged by the peer. The check
is a poll, not a timer: the blocks are released as soon as the peer's receive window lets
the data through, and never before. "Delivered" means what the egress buffer's stall watchdog
means by progress (``harness._egress._watchdog``): bytes the peer acknowledged; the bytes
written and not yet acknowledged are the ones both count as owed.

Sources: ``SIOCOUTQ`` (= ``TIOCOUTQ``, 0x5411) returns "the amount of unsent data in the
socket send queue" (tcp(7)); for TCP the kernel answers ``write_seq - snd_una``, the bytes
written but not yet acknowledged, which ``ss`` shows as Send-Q. ``TCP_INFO``'s first byte
is the TCP state (``tcpi_state``, ``linux/tcp.h``); 7 is ``TCP_CLOSE`` (after an RST or a
completed close).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import socket
import struct
from typing import Any

SIOCOUTQ = 0x5411
"""ioctl request: bytes in a socket's send queue not yet acknowledged (tcp(7))."""

TCP_CLOSE = 7
TCP_LISTEN = 10

TRANSPORT_SCOPE_KEY = "zerowindow.sim.transport"
"""ASGI scope key under which the emulator's app stores the connection's transport."""


def transport_from_send(send: Any) -> asyncio.Transport | None:
    """The asyncio transport behind an ASGI ``send`` callable, if it is uvicorn's.

    uvicorn (h11 and httptools protocols) calls the app with the bound method
    ``RequestResponseCycle.send``, whose object holds the connection's ``transport``.
    Returns None for other servers or wrapped callables.
    """
    owner = getattr(send, "__self__", None)
    transport = getattr(owner, "transport", None)
    if transport is None or not hasattr(transport, "get_write_buffer_size"):
        return None
    return transport


class DeliveryProbe:
    """Watches one server-side TCP connection for undelivered bytes.

    Holds a duplicate of the socket's file descriptor, so the connection can still be
    watched after the server closes its own descriptor (uvicorn's keep-alive timeout closes
    an idle connection after a complete response; with a duplicate, the kernel keeps the
    connection, and its unacknowledged bytes, until ``close()``). Raises ``OSError`` if the
    transport has no socket.
    """

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is None:
            raise OSError("transport has no socket")
        self._transport = transport
        # socket.socket(fileno=...) leaves the shared O_NONBLOCK flag alone; closing it
        # closes only the duplicate (no FIN while the server's descriptor is open).
        self._sock: socket.socket | None = socket.socket(fileno=os.dup(sock.fileno()))

    def undelivered_bytes(self) -> int | None:
        """Bytes written and not yet acknowledged by the peer; None once the peer is gone.

        Counts the transport's write buffer (bytes) plus the kernel send queue (bytes).
        "Gone" means the TCP state is CLOSE (reset, or fully closed) or the socket is
        unusable.
        """
        sock = self._sock
        if sock is None:
            return None
        try:
            state = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)[0]
            if state in (TCP_CLOSE, TCP_LISTEN):
                return None
            outq = struct.unpack("i", fcntl.ioctl(sock.fileno(), SIOCOUTQ, b"\0\0\0\0"))[0]
        except OSError:
            return None
        try:
            buffered = self._transport.get_write_buffer_size()  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            buffered = 0
        return int(buffered) + int(outq)

    async def wait_delivered(self, *, poll_s: float) -> bool:
        """Poll every ``poll_s`` seconds until nothing is undelivered or the peer is gone.

        Returns True if everything was delivered, False if the peer went away first.
        """
        while True:
            left = self.undelivered_bytes()
            if left is None:
                return False
            if left == 0:
                return True
            await asyncio.sleep(poll_s)

    def close(self) -> None:
        """Close the duplicate descriptor (idempotent)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
