"""Reaching a server: free ports, health polling, and the error a server that cannot be
reached raises."""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable, Iterable

import httpx

from zwcore import TargetError, http_client


def free_port(host: str = "127.0.0.1", *, besides: Iterable[int] = ()) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, then release), other
    than the ports in ``besides`` (a process's second port: the kernel may hand out a port just
    released again, so two calls in a row can give the same one). For an address this
    namespace does not have (a run's server address, which lives in the run's new server
    namespace, where every port is free), a port free on loopback. Raises ``OSError`` when
    neither can be bound."""
    taken = set(besides)
    held: list[socket.socket] = []  # ports in `besides` stay bound until a new one comes
    try:
        while True:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(s)
            try:
                s.bind((host, 0))
            except OSError as exc:
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise
                s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in taken:
                return port
    finally:
        for s in held:
            s.close()


def wait_healthy(
    base_url: str, *, timeout_s: float, alive: Callable[[], str | None] | None = None
) -> None:
    """Poll ``GET {base_url}/health`` until it answers 200.

    ``alive`` is an optional callable returning a failure reason or ``None``; polling stops
    early when it reports one. Raises :class:`TargetError` on timeout or early failure.
    """
    deadline = time.monotonic() + timeout_s
    last = "no answer yet"
    with http_client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if alive is not None and (reason := alive()):
                raise TargetError(f"target failed while starting: {reason}")
            try:
                response = client.get(f"{base_url}/health")
                if response.status_code == 200:
                    return
                last = f"HTTP {response.status_code}"
            except httpx.HTTPError as exc:
                last = type(exc).__name__
            time.sleep(0.5)
    raise TargetError(f"{base_url}/health did not answer 200 within {timeout_s:g} s (last: {last})")
