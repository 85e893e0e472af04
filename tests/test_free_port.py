"""free_port's second port: the kernel may hand out a port just released again (a fresh clone's
Envoy got its listener's port for its admin interface), so ``besides`` keeps a process's first
port out of its second."""

from __future__ import annotations

import socket
from types import SimpleNamespace
from typing import Any

import pytest

from harness.servers import _health
from harness.servers._health import free_port


class _Socket:
    """Binds to the next of a list of ports, as a kernel that hands one out twice would."""

    ports: list[int] = []
    closed = 0

    def __init__(self, *args: Any) -> None:
        self.port = 0

    def bind(self, address: tuple[str, int]) -> None:
        self.port = _Socket.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def close(self) -> None:
        _Socket.closed += 1


def test_a_port_in_besides_is_never_given(monkeypatch: pytest.MonkeyPatch) -> None:
    # _health's own name for the socket module, not the module itself (other threads use it)
    fake = SimpleNamespace(socket=_Socket, AF_INET=socket.AF_INET, SOCK_STREAM=socket.SOCK_STREAM)
    monkeypatch.setattr(_health, "socket", fake)
    _Socket.ports, _Socket.closed = [40000, 40000, 40001], 0
    assert free_port() == 40000
    assert free_port(besides=[40000]) == 40001  # the first answer held while asking again
    assert _Socket.closed == 3 and not _Socket.ports


def test_a_real_second_port_differs_and_is_free() -> None:
    first = free_port()
    second = free_port(besides=[first])
    assert second != first and second > 0
