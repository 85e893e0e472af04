"""Server-side TCP socket observation from ``/proc/net/tcp`` and ``/proc/net/tcp6``.

Each line of those files describes one socket of the current network namespace; for an
established socket ``tx_queue`` is the Send-Q (bytes written by the application and not yet
acknowledged by the peer) and ``rx_queue`` the Recv-Q, the same figures ``ss -tn`` prints
(proc(5), ``net/ipv4/tcp_ipv4.c:get_tcp4_sock``).
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from pathlib import Path

# Kernel TCP states, include/net/tcp_states.h.
TCP_STATES = {
    1: "ESTABLISHED",
    2: "SYN_SENT",
    3: "SYN_RECV",
    4: "FIN_WAIT1",
    5: "FIN_WAIT2",
    6: "TIME_WAIT",
    7: "CLOSE",
    8: "CLOSE_WAIT",
    9: "LAST_ACK",
    10: "LISTEN",
    11: "CLOSING",
}


@dataclass(frozen=True)
class TcpSocket:
    """One TCP socket as the kernel reports it. Queues are in bytes; ``inode`` is the socket's
    inode, which a process holding it shows as a ``socket:[<inode>]`` link in ``/proc/<pid>/fd``
    (0: no process holds it, as in ``TIME_WAIT``)."""

    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    state: str
    send_q_bytes: int
    recv_q_bytes: int
    inode: int = 0


def _decode_addr(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # The kernel prints each 32-bit word in host byte order (little-endian here).
    words = struct.unpack(f"<{len(raw) // 4}I", raw)
    packed = struct.pack(f">{len(words)}I", *words)
    family = socket.AF_INET if len(packed) == 4 else socket.AF_INET6
    addr = socket.inet_ntop(family, packed)
    return addr.removeprefix("::ffff:") if family == socket.AF_INET6 else addr


def parse_proc_net_tcp(text: str) -> list[TcpSocket]:
    """Parse the text of ``/proc/net/tcp`` or ``/proc/net/tcp6`` into sockets.

    Raises ``ValueError`` on a line that is not in the kernel's format.
    """
    sockets = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote, state_hex, queues = fields[1], fields[2], fields[3], fields[4]
        local_addr, local_port = local.split(":")
        remote_addr, remote_port = remote.split(":")
        tx_q, rx_q = queues.split(":")
        state = int(state_hex, 16)
        sockets.append(
            TcpSocket(
                local_addr=_decode_addr(local_addr),
                local_port=int(local_port, 16),
                remote_addr=_decode_addr(remote_addr),
                remote_port=int(remote_port, 16),
                state=TCP_STATES.get(state, str(state)),
                send_q_bytes=int(tx_q, 16),
                recv_q_bytes=int(rx_q, 16),
                inode=int(fields[9]),
            )
        )
    return sockets


def tcp_sockets(*, local_port: int | None = None, proc: str = "/proc") -> list[TcpSocket]:
    """Return the TCP sockets (IPv4 and IPv6) of this network namespace.

    ``local_port`` keeps only sockets bound to that port (the server side of a listener's
    connections, and the listener itself). ``proc`` is the procfs mount to read.
    """
    found: list[TcpSocket] = []
    for name in ("net/tcp", "net/tcp6"):
        path = Path(proc) / name
        if path.exists():
            found.extend(parse_proc_net_tcp(path.read_text()))
    if local_port is not None:
        found = [s for s in found if s.local_port == local_port]
    return found
