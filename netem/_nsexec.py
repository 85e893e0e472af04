"""Doing things inside a named network namespace: commands, netlink handles and sockets.

A namespace is named as ``ip netns`` names it (a file under ``/run/netns``); ``None`` means the
namespace of the calling process. Nothing here creates or deletes a namespace.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

from pyroute2 import IPRoute

from netem._errors import NetnsError

NETNS_DIR = "/run/netns"
_CLONE_NEWNET = 0x40000000

T = TypeVar("T")


def netns_path(netns: str) -> str:
    path = os.path.join(NETNS_DIR, netns)
    if not os.path.exists(path):
        raise NetnsError(f"network namespace {netns!r} does not exist ({path} missing)")
    return path


def ns_argv(netns: str | None, argv: Sequence[str]) -> list[str]:
    """``argv`` prefixed with ``ip netns exec NETNS`` when a namespace is named."""
    return (["ip", "netns", "exec", netns] if netns else []) + list(argv)


def run(
    netns: str | None, argv: Sequence[str], *, input: str | None = None, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a command in ``netns``; raises :class:`NetnsError` with its stderr when ``check``."""
    full = ns_argv(netns, argv)
    try:
        res = subprocess.run(full, input=input, capture_output=True, text=True, timeout=30)
    except FileNotFoundError as e:
        raise NetnsError(f"{argv[0]}: command not found") from e
    if check and res.returncode != 0:
        where = f" in netns {netns}" if netns else ""
        msg = (res.stderr or res.stdout).strip()
        raise NetnsError(f"`{' '.join(argv)}`{where} failed: {msg}")
    return res


def ipr(netns: str | None) -> IPRoute:
    """An rtnetlink handle in ``netns`` (caller closes it; usable as a context manager)."""
    if netns:
        netns_path(netns)
        return IPRoute(netns=netns)
    return IPRoute()


_libc = ctypes.CDLL(None, use_errno=True)


def in_netns(netns: str | None, fn: Callable[[], T]) -> T:
    """Call ``fn`` in a short-lived thread that has joined ``netns`` (setns(2) is per thread).

    Sockets created by ``fn`` stay in that namespace after the thread ends, so the caller can
    use them from any thread; the calling thread's own namespace is never changed.
    """
    if netns is None:
        return fn()
    path = netns_path(netns)
    box: dict[str, object] = {}

    def target() -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns({path}): {os.strerror(err)}")
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e
        finally:
            os.close(fd)

    t = threading.Thread(target=target, name=f"netns-{netns}")
    t.start()
    t.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def socket_in(netns: str | None, family: int = socket.AF_INET,
              type: int = socket.SOCK_STREAM) -> socket.socket:
    """A new socket that lives in ``netns``."""
    return in_netns(netns, lambda: socket.socket(family, type))
