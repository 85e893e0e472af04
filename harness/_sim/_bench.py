"""Throughput benchmark of the engine emulator: many concurrent streams from one process.

Starts ``python -m harness._sim`` pinned to one CPU (``taskset``, when present), opens
``streams`` concurrent streaming ``/v1/completions`` requests from this process (a raw
asyncio HTTP/1.1 client, pinned to another CPU, each connection reading as fast as it can
and issuing a new request after each ``[DONE]``) and measures, over ``duration_s`` seconds
after a warm-up: tokens/s from the server's ``vllm:generation_tokens_total`` and completed
streams/s as seen by the clients. ``ramp_s`` is the time until 95 % of the streams were
running (how fast the server accepted the connections).

    python -m harness._sim._bench --streams 2000 --max-tokens 200 --duration-s 20

The engine settings make the emulator itself the bottleneck (no modelled step cost, room
for every stream in the batch). The server runs uvicorn's asyncio loop by default: under
this load uvloop (the ``auto`` choice, what ``vllm serve`` runs) accepted pending
connections at about 30 per second, so 2,000 streams took minutes to ramp up.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

_GEN = re.compile(rb"^vllm:generation_tokens_total\{[^}]*\} (\S+)$", re.M)
_RUN = re.compile(rb"^vllm:num_requests_running\{[^}]*\} (\S+)$", re.M)


@dataclass(frozen=True)
class BenchResult:
    """What one benchmark run measured (rates per second over ``duration_s``)."""

    streams: int
    max_tokens: int
    duration_s: float
    tokens_per_s: float
    completed_streams_per_s: float
    mean_running: float
    ramp_s: float
    loop: str
    server_cpu: str
    client_cpu: str
    command: str


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: sim\r\nConnection: close\r\n\r\n".encode())
    data = await reader.read(-1)
    writer.close()
    return data


class _Scraper:
    """``/metrics`` over one keep-alive connection, opened before the load (a new
    connection would queue behind the load's pending connections)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def scrape(self) -> tuple[float, float]:
        """(``vllm:generation_tokens_total``, ``vllm:num_requests_running``)."""
        try:
            return await self._scrape()
        except (ConnectionError, asyncio.IncompleteReadError):
            # the server closed the idle connection (uvicorn's keep-alive timeout is 5 s, the
            # length of the default warm-up): open a new one, the load is connected by now
            self._conn = None
            return await self._scrape()

    async def _scrape(self) -> tuple[float, float]:
        if self._conn is None:
            self._conn = await asyncio.open_connection("127.0.0.1", self.port)
        reader, writer = self._conn
        writer.write(b"GET /metrics HTTP/1.1\r\nHost: sim\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"content-length: (\d+)", head, re.I)
        assert length is not None
        text = await reader.readexactly(int(length.group(1)))
        gen = _GEN.search(text)
        run = _RUN.search(text)
        return (float(gen.group(1)) if gen else 0.0, float(run.group(1)) if run else 0.0)


async def _stream_forever(port: int, max_tokens: int, done: list[int], i: int) -> None:
    body = json.dumps(
        {"prompt": f"client {i} says hello", "max_tokens": max_tokens, "ignore_eos": True,
         "stream": True}
    ).encode()  # fmt: skip
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    ) + body
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    while True:
        writer.write(request)
        tail = b""
        while True:
            chunk = await reader.read(65536)
            if not chunk:
                return
            tail = (tail + chunk)[-64:]
            if b"data: [DONE]\n\n\r\n0\r\n\r\n" in tail:
                break
        done[0] += 1


async def _run(
    port: int, streams: int, max_tokens: int, warmup_s: float, duration_s: float
) -> tuple[float, float, float, float]:
    """(tokens/s, completed streams/s, mean running, seconds until all streams ran)."""
    scraper = _Scraper(port)
    await scraper.scrape()
    done = [0]
    tasks = []
    start = time.monotonic()
    for i in range(streams):
        tasks.append(asyncio.create_task(_stream_forever(port, max_tokens, done, i)))
        if i % 100 == 99:
            await asyncio.sleep(0.01)
    ramp_s = float("nan")
    while time.monotonic() - start < 300:
        if (await scraper.scrape())[1] >= 0.95 * streams:
            ramp_s = time.monotonic() - start
            break
        await asyncio.sleep(0.5)
    await asyncio.sleep(warmup_s)
    gen0, _ = await scraper.scrape()
    done0, t0 = done[0], time.monotonic()
    running: list[float] = []
    while time.monotonic() - t0 < duration_s:
        await asyncio.sleep(1.0)
        running.append((await scraper.scrape())[1])
    gen1, _ = await scraper.scrape()
    elapsed = time.monotonic() - t0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    mean_running = sum(running) / len(running) if running else 0.0
    return (gen1 - gen0) / elapsed, (done[0] - done0) / elapsed, mean_running, ramp_s


def run_benchmark(
    *,
    streams: int = 2000,
    max_tokens: int = 200,
    warmup_s: float = 5.0,
    duration_s: float = 20.0,
    server_cpu: str = "0",
    client_cpu: str = "1",
    loop: str = "asyncio",
) -> BenchResult:
    """Run the benchmark described in the module docstring; returns the measurements.

    Raises ``RuntimeError`` if the server does not come up within 30 s.
    """
    port = _free_port()
    server_cmd = [
        sys.executable, "-m", "harness._sim", "--port", str(port), "--log-level", "warning",
        "--max-num-seqs", str(streams + 16), "--num-blocks", str(streams * 2 + 64),
        "--block-size", "256", "--step-fixed-ms", "0", "--decode-ms-per-seq", "0",
        "--prefill-ms-per-token", "0", "--loop", loop,
    ]  # fmt: skip
    if shutil.which("taskset"):
        server_cmd = ["taskset", "-c", server_cpu, *server_cmd]
        os.sched_setaffinity(0, {int(client_cpu)})
    server = subprocess.Popen(server_cmd)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                asyncio.run(_get(port, "/health"))
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("sim server did not start") from None
                time.sleep(0.2)
        try:
            import uvloop

            factory: Any = uvloop.new_event_loop
        except ImportError:  # pragma: no cover
            factory = None
        with asyncio.Runner(loop_factory=factory) as runner:
            tps, sps, mean_running, ramp_s = runner.run(
                _run(port, streams, max_tokens, warmup_s, duration_s)
            )
    finally:
        server.terminate()
        server.wait(30)
    return BenchResult(
        streams=streams,
        max_tokens=max_tokens,
        duration_s=duration_s,
        tokens_per_s=round(tps, 1),
        completed_streams_per_s=round(sps, 2),
        mean_running=round(mean_running, 1),
        ramp_s=round(ramp_s, 1),
        loop=loop,
        server_cpu=server_cpu,
        client_cpu=client_cpu,
        command=" ".join(server_cmd),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the benchmark and print its result as JSON."""
    parser = argparse.ArgumentParser(prog="python -m harness._sim._bench")
    parser.add_argument("--streams", type=int, default=2000)
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    parser.add_argument("--duration-s", type=float, default=20.0)
    parser.add_argument("--server-cpu", default="0")
    parser.add_argument("--client-cpu", default="1")
    parser.add_argument("--loop", default="asyncio", choices=["auto", "asyncio", "uvloop"])
    a = parser.parse_args(argv)
    result = run_benchmark(
        streams=a.streams,
        max_tokens=a.max_tokens,
        warmup_s=a.warmup_s,
        duration_s=a.duration_s,
        server_cpu=a.server_cpu,
        client_cpu=a.client_cpu,
        loop=a.loop,
    )
    print(json.dumps(asdict(result), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
