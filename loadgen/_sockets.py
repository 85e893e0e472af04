"""Socket options and ways of closing a client TCP connection.

Sources: socket(7) for ``SO_RCVBUF`` and ``SO_LINGER``; tcp(7) for receive-buffer
auto-tuning and the window scale; RFC 9293 §3.10.4 (an ABORT sends RST); RFC 2525 §2.17 and
Linux ``tcp_close()`` (closing a socket with unread received data sends RST, not FIN).
"""

from __future__ import annotations

import socket
import struct

# Linux TCP states (include/net/tcp_states.h), as ``tcpi_state``, the first byte of TCP_INFO.
TCP_CLOSE = 7
TCP_CLOSE_WAIT = 8


def set_rcvbuf(sock: socket.socket, rcvbuf_bytes: int) -> int:
    """Set ``SO_RCVBUF`` and return the value the kernel reports back (bytes).

    Must be called before ``connect``: the TCP window scale is fixed in the SYN from the buffer
    size (tcp(7)), and setting ``SO_RCVBUF`` turns off receive-buffer auto-tuning. Linux doubles
    the value to leave room for bookkeeping and ``getsockopt`` returns the doubled value; the
    usable window is smaller still (socket(7), ``net.core.rmem_max`` caps the request).
    Raises ``OSError`` from ``setsockopt``.
    """
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf_bytes)
    return int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))


def local_address(sock: socket.socket) -> tuple[str | None, int | None]:
    """The connected socket's local ``(address, port)`` (getsockname), or ``(None, None)``."""
    try:
        name = sock.getsockname()
    except OSError:
        return None, None
    if isinstance(name, tuple) and len(name) >= 2:
        return str(name[0]), int(name[1])
    return None, None


def close_abortive(sock: socket.socket) -> None:
    """Close so that the peer gets a TCP RST: ``SO_LINGER`` ``{l_onoff=1, l_linger=0}``, close.

    socket(7): with linger on and a zero timeout, ``close`` discards unsent data and resets the
    connection (RFC 9293 §3.10.4 ABORT). Errors are ignored: the socket ends closed either way.
    """
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


def close_orderly(sock: socket.socket, *, drain_limit_bytes: int = 1 << 20) -> int:
    """Send FIN (``shutdown(SHUT_WR)``), discard what is already received, then close.

    Returns the number of bytes discarded. Draining matters because Linux answers ``close`` of a
    socket with unread received data with RST instead of FIN (RFC 2525 §2.17); data that arrives
    after the drain still turns the close, or the peer's next write, into an RST. At most
    ``drain_limit_bytes`` are discarded, without blocking. Errors are ignored.
    """
    drained = 0
    try:
        sock.shutdown(socket.SHUT_WR)
        sock.setblocking(False)
        while drained < drain_limit_bytes:
            data = sock.recv(65536)
            if not data:
                break
            drained += len(data)
    except OSError:  # BlockingIOError (nothing more to read), ECONNRESET, ENOTCONN...
        pass
    sock.close()
    return drained


def tcp_state(sock: socket.socket) -> int | None:
    """The connection's Linux TCP state (``tcpi_state``, first byte of ``TCP_INFO``, tcp(7)),
    or ``None`` if it cannot be read (closed socket, not Linux).

    Reading it never consumes data nor clears a pending socket error, unlike ``recv`` or
    ``getsockopt(SO_ERROR)``.
    """
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
    except (OSError, AttributeError):
        return None
    return info[0] if info else None


def peer_cut(sock: socket.socket) -> str | None:
    """How the peer ended a connection this side has neither closed nor half-closed: ``"rst"``
    (the kernel moved it to CLOSE: a RST arrived, or retransmissions timed out), ``"fin"``
    (CLOSE_WAIT: a FIN arrived, in sequence after every byte already received), or ``None``
    while it is established. Unread data in the receive buffer does not hide either, and
    nothing is read (see :func:`tcp_state`)."""
    state = tcp_state(sock)
    if state == TCP_CLOSE:
        return "rst"
    if state == TCP_CLOSE_WAIT:
        return "fin"
    return None


def response_complete_in_buffer(sock: socket.socket) -> bool:
    """Whether the bytes waiting unread in the receive buffer end with the last chunk of a
    chunked HTTP/1.1 body (``0\\r\\n\\r\\n``, RFC 9112 §7.1), i.e. a FIN that follows them
    ends a complete response rather than cutting it. Peeks (``MSG_PEEK``): nothing is consumed
    and the receive window does not open. ``False`` if nothing can be peeked."""
    try:
        size = int(sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF))
        data = sock.recv(max(size, 65536), socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except OSError:
        return False
    return data.endswith(b"0\r\n\r\n")
