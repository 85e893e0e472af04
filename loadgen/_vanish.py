"""A client that vanishes: from one moment on, no packet of its connection passes either way.

This is what a server sees when a phone loses its network or a NAT forgets the flow: no FIN,
no RST, only silence, so the server learns of it from its retransmission timeout
(``tcp_retries2``, about 15 minutes by default, tcp(7)) or from a timeout of its own.
Closing the socket cannot do that (the kernel sends FIN or RST), so :func:`vanish` adds
nftables drop rules for the connection's 4-tuple, both directions, in this process's network
namespace (loopback included), and keeps the socket open so that its port is not reused.

The rules must outlive the client: when its process exits the kernel closes the socket and
sends FIN, which must be dropped too. So under the harness they live in the run's table,
named by :data:`VANISH_TABLE_ENV` (every load process of the run adds to it; the harness
deletes it at the end of the run, when the server may hear the close at last). Without that
variable (a plain locustfile) the table is ``inet zw-vanish-<pid>``, deleted when the process
exits (``atexit``). ``netem clean`` removes any table left behind: every ``zw-`` table is the
toolkit's. Needs the ``nft`` command (nftables(8)) and CAP_NET_ADMIN.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import socket
import subprocess
import threading

from ._sockets import close_abortive

TABLE_PREFIX = "zw-vanish-"
VANISH_TABLE_ENV = "ZEROWINDOW_VANISH_TABLE"
"""Environment variable naming the nftables table (family ``inet``) that holds the run's drop
rules; set by the harness for every load process."""


class VanishError(OSError):
    """The drop rules could not be added (no ``nft``, no CAP_NET_ADMIN, or nft refused)."""


_lock = threading.Lock()
_table: str | None = None
_kept: list[socket.socket] = []  # vanished sockets, kept open until the process exits


def _nft(*args: str, stdin: str | None = None) -> None:
    nft = shutil.which("nft")
    if nft is None:
        raise VanishError("vanish needs the nft command (Debian package nftables)")
    res = subprocess.run(
        [nft, *args], input=stdin, capture_output=True, text=True, check=False, timeout=10
    )
    if res.returncode != 0:
        raise VanishError(f"nft {' '.join(args)}: {res.stderr.strip() or res.returncode}")


def _ensure_table() -> str:
    global _table
    if _table is None:
        shared = os.environ.get(VANISH_TABLE_ENV)
        name = shared or f"{TABLE_PREFIX}{os.getpid()}"
        _nft(  # "add" leaves a table or chain that already exists as it is
            "-f",
            "-",
            stdin=(
                f"add table inet {name}\n"
                f"add chain inet {name} out {{ type filter hook output priority -300; }}\n"
                f"add chain inet {name} in {{ type filter hook input priority -300; }}\n"
            ),
        )
        _table = name
        if not shared:
            atexit.register(release)
    return _table


def _match(src: tuple[str, int], dst: tuple[str, int]) -> str:
    family = "ip6" if ipaddress.ip_address(src[0]).version == 6 else "ip"
    return f"{family} saddr {src[0]} tcp sport {src[1]} {family} daddr {dst[0]} tcp dport {dst[1]}"


def vanish(sock: socket.socket) -> None:
    """Drop every packet of ``sock``'s connection from now on, both ways, and keep the socket
    open (unread, never closed) until the process exits. Raises :class:`VanishError` when the
    rules cannot be added (the socket is then closed with RST, so the stream still ends)."""
    try:
        local = sock.getsockname()[:2]
        peer = sock.getpeername()[:2]
    except OSError:
        sock.close()  # already gone: nothing left to silence
        return
    with _lock:
        try:
            table = _ensure_table()
            rules = "".join(
                f"add rule inet {table} {chain} {_match(a, b)} drop\n"
                for chain in ("out", "in")
                for a, b in ((local, peer), (peer, local))
            )
            _nft("-f", "-", stdin=rules)
        except (VanishError, subprocess.TimeoutExpired) as exc:
            close_abortive(sock)
            raise VanishError(str(exc)) from exc
        _kept.append(sock)


def release() -> None:
    """Delete this process's drop table (:data:`VANISH_TABLE_ENV`'s, if set), then close the
    vanished sockets (their FIN reaches the peer now). Idempotent; errors are ignored
    (``netem clean`` is the fallback)."""
    global _table
    with _lock:
        if _table is not None:
            try:
                _nft("delete", "table", "inet", _table)
            except (VanishError, subprocess.TimeoutExpired):
                pass
            _table = None
        while _kept:
            _kept.pop().close()
