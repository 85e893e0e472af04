"""A proxy kind defined outside the toolkit, in one file with one registration: a plain TCP
relay (``python -m tests.kind_tcp_relay LISTEN_PORT UPSTREAM_HOST UPSTREAM_PORT``) that copies
bytes both ways. ``tests/test_extending.py`` shows that a scenario names it and runs through it.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Literal

from harness.servers import PROXIES, Proxy, ProxyConfigBase, ServerProcess, free_port


@PROXIES.register
class TcpRelayConfig(ProxyConfigBase):
    """Options of the ``tcp-relay`` kind."""

    kind: Literal["tcp-relay"] = "tcp-relay"
    listen_host: str = "127.0.0.1"

    def build(self) -> Proxy:
        return TcpRelay(self)


class TcpRelay(Proxy):
    """This module run as a process in front of the target."""

    kind = "tcp-relay"

    def __init__(self, config: TcpRelayConfig) -> None:
        self.config = config
        self.port = free_port(config.listen_host)
        self.server = ServerProcess("tcp relay")

    def processes(self) -> list[ServerProcess]:
        return [self.server]

    def start(self, run_dir: Path, upstream_url: str) -> str:
        host, _, port = upstream_url.removeprefix("http://").rpartition(":")
        argv = [sys.executable, "-m", "tests.kind_tcp_relay", str(self.port), host, port]
        url = f"http://{self.config.listen_host}:{self.port}"
        self.server.launch(argv, log_path=run_dir / "tcp-relay.log", url=url, timeout_s=15)
        return url


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except ConnectionError:
        pass
    finally:
        writer.close()


async def _serve(listen_port: int, host: str, port: int) -> None:
    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection(host, port)
        await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))

    server = await asyncio.start_server(relay, "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve(int(sys.argv[1]), sys.argv[2], int(sys.argv[3])))
