"""The floor of a proxy written in Python: a byte pipe on uvloop (``python bench/_byte_pipe.py
HOST:PORT UPSTREAM_PORT``), measured beside the egress buffer by ``bench/_egress_levers.py``.

Each client connection gets one upstream connection (127.0.0.1:UPSTREAM_PORT); every read from
either side is written to the other as it came, in one write: no HTTP parsing, no framing
check, no bookkeeping, no stall watchdog. Client sockets get what the bench gives the egress
buffer's (``TCP_NODELAY``, a 32 KiB ``SO_SNDBUF``). What it costs per event is what uvloop and
the interpreter cost for one read and one write; the egress buffer can only add to it.
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvloop

SNDBUF = 32 * 1024


class Upstream(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class Client(asyncio.Protocol):
    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.early: list[bytes] | None = []  # bytes read before the upstream connected
        self.upstream: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport: asyncio.Transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF)
        asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_connection(
                lambda: Upstream(self), "127.0.0.1", self.upstream_port
            )
        except OSError:
            self.transport.close()
            return
        self.upstream = transport
        for data in self.early or ():
            transport.write(data)
        self.early = None

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            if self.early is not None:
                self.early.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(listen: str, upstream_port: int) -> None:
    host, port = listen.rsplit(":", 1)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: Client(upstream_port), host, int(port), backlog=1024)
    await asyncio.Event().wait()


if __name__ == "__main__":
    uvloop.run(serve(sys.argv[1], int(sys.argv[2])))
