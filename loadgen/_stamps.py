"""Kernel receive timestamps: when the bytes a ``recv`` returns reached the client's socket.

A client process stamps a read when it gets to run, which on a busy load process is after the
other streams woken by the same poll; the kernel stamps a segment when it arrives, whatever
the client is doing. With ``SO_TIMESTAMPNS`` set, ``recvmsg(2)`` on a TCP socket carries one
``SCM_TIMESTAMPNS`` control message, a ``struct timespec`` in CLOCK_REALTIME, for the last
segment whose bytes the call returned (socket(7); Linux ``tcp_recv_timestamp()`` in
``net/ipv4/tcp.c``). :class:`ArrivalClock` turns it into CLOCK_MONOTONIC seconds, the clock
of every other time in a record, with the offset between the two clocks sampled once per
request.

Stamping on arrival is right only for a client that reads as soon as bytes arrive (full speed):
a paced or stalled reader's bytes wait in its receive buffer by design, and what it saw is
when it read them. The client decides that (``_stream``); this module only reads the stamps.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Sequence

# Python 3.11 does not export it; asm-generic/socket.h (x86, arm, arm64, riscv...):
# SO_TIMESTAMPNS_OLD, whose control message carries the native struct timespec.
SO_TIMESTAMPNS: int = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("@ql")  # time_t tv_sec, long tv_nsec (64-bit Linux)
_SCM = (socket.SOL_SOCKET, SO_TIMESTAMPNS)
ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size)
"""``ancbufsize`` for ``recvmsg``: room for one ``SCM_TIMESTAMPNS`` message."""


_keeper: socket.socket | None = None
_TURN_ON_WAIT_S = 0.2


def _keep_stamping() -> None:
    """Hold one socket with ``SO_TIMESTAMPNS`` for the life of the process, and wait (at most
    :data:`_TURN_ON_WAIT_S`) until its segments arrive stamped. The kernel stamps arriving
    packets only while some socket asks for it, and turns stamping on and off from a work
    queue (``net_enable_timestamp()``, ``net/core/dev.c``): without a keeper, the first
    segments of each request of a closed loop could find stamping off. The keeper is a TCP
    connection over 127.0.0.1 that carries one byte per check; where loopback is not up (a
    network namespace without ``lo``), a UDP socket that only holds the option."""
    global _keeper
    if _keeper is not None:
        return
    try:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            keeper = socket.socket()
            keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
            keeper.connect(listener.getsockname())
            peer, _ = listener.accept()
        with peer:
            give_up = time.monotonic() + _TURN_ON_WAIT_S
            while True:
                peer.sendall(b"\0")
                _, ancdata, _, _ = keeper.recvmsg(1, ANCILLARY_BYTES)
                if ancdata or time.monotonic() > give_up:
                    break
                time.sleep(0.002)
    except OSError:
        keeper = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        keeper.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    _keeper = keeper


def enable_arrival_stamps(sock: socket.socket) -> bool:
    """Set ``SO_TIMESTAMPNS`` on ``sock`` (before ``connect``, so that every segment of the
    connection is stamped). Returns False where the kernel refuses it (then reads are stamped
    when they return). The first call in a process waits until the kernel stamps (see
    :func:`_keep_stamping`)."""
    try:
        _keep_stamping()
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


class ArrivalClock:
    """Kernel arrival times of one connection's reads, as CLOCK_MONOTONIC seconds.

    ``not_before`` (monotonic s, the request's send) bounds a usable stamp from below and the
    read's return time bounds it from above: a stamp outside (a step of CLOCK_REALTIME in the
    middle of the request, a segment never stamped) is replaced by the return time. Counts the
    reads stamped each way (``kernel_reads``, ``return_reads``) and the largest delay from
    arrival to return (``read_lag_max_s``): how late the client read.
    """

    __slots__ = ("offset_ns", "not_before", "kernel_reads", "return_reads", "read_lag_max_s")

    def __init__(self, *, not_before: float) -> None:
        m0 = time.monotonic_ns()
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        m1 = time.monotonic_ns()
        self.offset_ns = real - (m0 + m1) // 2  # CLOCK_REALTIME - CLOCK_MONOTONIC
        self.not_before = not_before
        self.kernel_reads = 0
        self.return_reads = 0
        self.read_lag_max_s = 0.0

    def stamp(self, ancdata: Sequence[tuple[int, int, bytes]], returned_s: float) -> float:
        """The arrival time (monotonic s) of the read whose ``recvmsg`` gave ``ancdata`` and
        returned at ``returned_s``; ``returned_s`` itself when no usable stamp came."""
        for level, kind, data in ancdata:
            if (level, kind) == _SCM and len(data) == _TIMESPEC.size:
                sec, nsec = _TIMESPEC.unpack_from(data)
                arrived = (sec * 1_000_000_000 + nsec - self.offset_ns) * 1e-9
                if self.not_before <= arrived <= returned_s:
                    self.kernel_reads += 1
                    lag = returned_s - arrived
                    if lag > self.read_lag_max_s:
                        self.read_lag_max_s = lag
                    return arrived
        self.return_reads += 1
        return returned_s

    def returned(self) -> None:
        """Count a read stamped when it returned (the client stopped stamping on arrival)."""
        self.return_reads += 1

    @property
    def label(self) -> str:
        """``"kernel"`` (every read stamped on arrival), ``"read"`` (none), or ``"mixed"``."""
        if not self.kernel_reads:
            return "read"
        return "kernel" if not self.return_reads else "mixed"
