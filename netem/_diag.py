"""Server-side TCP socket observation through ``inet_diag`` (``NETLINK_SOCK_DIAG``).

One dump per sample returns every TCP socket of a network namespace with its ``tcp_info``
(pyroute2's ``DiagSocket`` parses ``INET_DIAG_INFO``; field meanings and units are the
kernel's, ``include/uapi/linux/tcp.h``):

- Send-Q / Recv-Q: ``idiag_wqueue`` / ``idiag_rqueue`` (for a connected socket: bytes written
  and not yet acknowledged / received and not yet read; ``net/ipv4/tcp_diag.c``), the figures
  ``ss -tn`` prints;
- ``tcpi_snd_wnd``: the peer's advertised receive window after scaling, bytes (the rwnd the
  server sees; 0 is a zero window);
- ``tcpi_rtt``: smoothed RTT, microseconds; ``tcpi_total_retrans``: segments retransmitted;
  ``tcpi_probes``: unanswered zero-window probes / RTOs in a row;
- ``tcpi_busy_time``, ``tcpi_rwnd_limited``, ``tcpi_sndbuf_limited``: microseconds the socket
  spent sending, limited by the receiver's window, limited by its own send buffer (the
  kernel's "chrono" accounting, ``net/ipv4/tcp_output.c``; the running period is included).

The socket is opened inside the namespace (``netns``), so it sees that namespace's sockets.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from pyroute2.netlink import NETLINK_SOCK_DIAG
from pyroute2.netlink.diag import DiagSocket, MarshalDiag
from pyroute2.netlink.nlsocket import NetlinkSocket

from netem._sockets import TCP_STATES

# idiag_ext bit asking for INET_DIAG_INFO (tcp_info): 1 << (INET_DIAG_INFO - 1),
# include/uapi/linux/inet_diag.h.
_EXT_INFO = 1 << (2 - 1)
# Every state but LISTEN (10) and TIME_WAIT (6), which carry no connection data.
_STATES = 0xFFF & ~(1 << 10) & ~(1 << 6)


@dataclass(frozen=True)
class TcpConnInfo:
    """One TCP connection as ``inet_diag`` reports it. Queues and windows in bytes, times in
    ms (converted from the kernel's microseconds)."""

    local_addr: str
    local_port: int
    remote_addr: str
    remote_port: int
    state: str
    send_q_bytes: int
    recv_q_bytes: int
    snd_wnd_bytes: int | None
    rtt_ms: float | None
    retransmits: int | None
    zero_window_probes: int | None
    busy_ms: float | None
    rwnd_limited_ms: float | None
    sndbuf_limited_ms: float | None

    def row(self) -> dict[str, Any]:
        return self.__dict__.copy()


class _NsDiagSocket(DiagSocket):
    """pyroute2's DiagSocket opened inside network namespace ``netns`` (its own constructor
    takes no namespace; the NetlinkSocket base does)."""

    def __init__(self, netns: str | None = None) -> None:
        NetlinkSocket.__init__(self, NETLINK_SOCK_DIAG, netns=netns, flags=0)
        self.set_marshal(MarshalDiag())


def _ms(value: Any) -> float | None:
    return None if value is None else value / 1000.0


class TcpDiag:
    """A ``NETLINK_SOCK_DIAG`` socket in namespace ``netns`` (``None``: this process's).

    Use as a context manager or call :meth:`close`. Raises ``OSError`` if the namespace
    cannot be entered.
    """

    def __init__(self, *, netns: str | None = None) -> None:
        self.netns = netns
        self._sock = _NsDiagSocket(netns)
        self._sock.bind()

    def connections(self, local_ports: set[int] | None = None) -> list[TcpConnInfo]:
        """The namespace's TCP connections (IPv4 and IPv6, listeners and TIME_WAIT left out)
        whose local port is in ``local_ports`` (all if ``None``)."""
        out: list[TcpConnInfo] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for msg in self._sock.get_sock_stats(
                family=family, states=_STATES, extensions=_EXT_INFO
            ):
                sport = msg["idiag_sport"]
                if local_ports is not None and sport not in local_ports:
                    continue
                info = msg.get_attr("INET_DIAG_INFO") or {}
                get = info.get
                rtt = get("tcpi_rtt")
                out.append(
                    TcpConnInfo(
                        local_addr=_plain(msg["idiag_src"]),
                        local_port=sport,
                        remote_addr=_plain(msg["idiag_dst"]),
                        remote_port=msg["idiag_dport"],
                        state=TCP_STATES.get(msg["idiag_state"], str(msg["idiag_state"])),
                        send_q_bytes=msg["idiag_wqueue"],
                        recv_q_bytes=msg["idiag_rqueue"],
                        snd_wnd_bytes=get("tcpi_snd_wnd"),
                        rtt_ms=None if rtt is None else rtt / 1000.0,
                        retransmits=get("tcpi_total_retrans"),
                        zero_window_probes=get("tcpi_probes"),
                        busy_ms=_ms(get("tcpi_busy_time")),
                        rwnd_limited_ms=_ms(get("tcpi_rwnd_limited")),
                        sndbuf_limited_ms=_ms(get("tcpi_sndbuf_limited")),
                    )
                )
        return out

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> TcpDiag:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _plain(addr: str) -> str:
    return addr.removeprefix("::ffff:")


def tcp_connections(
    local_ports: set[int] | None = None, *, netns: str | None = None
) -> list[TcpConnInfo]:
    """One-shot :meth:`TcpDiag.connections`."""
    with TcpDiag(netns=netns) as diag:
        return diag.connections(local_ports)
