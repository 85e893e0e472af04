"""A cheaper ``recv`` for gevent sockets: wait for readability after a read that drained the
socket, instead of letting ``recv(2)`` fail with EAGAIN first."""

from __future__ import annotations

import socket
from typing import Any


class WaitFirstRecv:
    """``recv`` (or ``recvmsg``) of a gevent socket that, after a read that drained the
    socket, waits for it to be readable before calling ``recv(2)`` (gevent's own ``recv`` tries
    first, fails with EAGAIN, raises and catches it, then waits: a system call and an exception
    per wake-up).
    It uses gevent's socket internals (``_sock``, ``_wait``, ``_read_event``, the same since
    gevent 1.x); :meth:`of` gives None where they are missing. The socket must have no
    timeout (the request's deadline is a ``gevent.Timeout``)."""

    __slots__ = ("_recv", "_wait", "_readable", "_drained")

    def __init__(self, sock: Any, method: str) -> None:
        self._recv = getattr(sock._sock, method)
        self._wait = sock._wait
        self._readable = sock._read_event
        self._drained = False

    @classmethod
    def of(cls, sock: socket.socket, method: str) -> WaitFirstRecv | None:
        """The wrapper of ``sock``'s ``method`` (``"recv"`` or ``"recvmsg"``), or None."""
        if all(hasattr(sock, a) for a in ("_sock", "_wait", "_read_event")):
            return cls(sock, method)
        return None

    def __call__(self, n: int, *args: int) -> Any:
        """``recv(n)`` or ``recvmsg(n, ancbufsize)``: what the socket's own method returns;
        raises what it raises (``OSError``)."""
        if self._drained:
            self._wait(self._readable)
        while True:
            try:
                result = self._recv(n, *args)
            except BlockingIOError:
                self._wait(self._readable)
                continue
            self._drained = len(result[0] if args else result) < n
            return result
