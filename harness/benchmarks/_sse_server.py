"""A minimal OpenAI-style SSE server for the load-generator benchmarks (`zerowindow bench client`).

Every ``POST`` (any path) gets ``200 text/event-stream`` with chunked transfer coding and
``--events`` completion chunks shaped like vLLM's ``/v1/completions`` chunks, then a
usage-only chunk and ``data: [DONE]``. Each chunk's ``text`` is the server's
``time.monotonic_ns()`` taken just before the chunk was handed to the kernel, then a space:
the emission timestamp a client's measurements are checked against (same machine, so both
sides read the same CLOCK_MONOTONIC). The request body is read and ignored.

Pacing (``--interval-ms``): with a positive interval one ticker writes the next chunk of
every stream each interval (a stream whose socket is not writable skips the tick: a slow
reader is never buffered in user space); with 0 each stream writes as fast as its socket
takes it (pausing when the transport's buffer passes 64 KiB), ``--flood-batch`` chunks per
write, so that the server outpaces the client it measures (one chunk per write cost this
server as much CPU per chunk as the toolkit's client spends reading it: the server, not the
client, then set the ceiling).

Every ``--stats-interval-s`` it prints one JSON line to stdout::

    {"t": <monotonic s>, "open": <streams open>, "started": N, "finished": N, "events": N}

    python -m harness.benchmarks._sse_server --port 8100 --events 2000 --interval-ms 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time

_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
    b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
)
_PREFIX = b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
_PREFIX += b'"choices":[{"index":0,"text":"'
_SUFFIX = b' ","logprobs":null,"finish_reason":null,"stop_reason":null}],"usage":null}\n\n'
_USAGE = (
    b'data: {"id":"cmpl-bench","object":"text_completion","created":0,"model":"bench",'
    b'"choices":[],"usage":{"prompt_tokens":1,"total_tokens":%d,"completion_tokens":%d}}\n\n'
)
_DONE = b"data: [DONE]\n\n"


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


class Stats:
    def __init__(self) -> None:
        self.open = self.started = self.finished = self.events = 0


class Stream(asyncio.Protocol):
    """One connection: reads the request head and body, then streams."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.streaming = False
        self.paused = False
        self.sent = 0
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=65536)

    def data_received(self, data: bytes) -> None:
        if self.streaming:
            return
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        length = 0
        for line in self.buf[:head_end].split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip() or 0)
        if len(self.buf) - head_end - 4 < length:
            return
        self.streaming = True
        self.buf = b""
        self.server.begin(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self.server.interval_s == 0:
            self.flood()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.end(self)

    def write_events(self, n: int = 1) -> None:
        """Write the next ``n`` chunks (fewer at the end) in one write, each stamped as it is
        made, and the end of the stream after the last one."""
        assert self.transport is not None
        server = self.server
        n = min(n, server.events - self.sent)
        out = [_chunk(_PREFIX + b"%d" % time.monotonic_ns() + _SUFFIX) for _ in range(n)]
        self.sent += n
        server.stats.events += n
        last = self.sent >= server.events
        if last:
            total = self.sent
            out.append(_chunk(_USAGE % (total + 1, total)) + _chunk(_DONE) + b"0\r\n\r\n")
        self.transport.write(b"".join(out))  # one chunk: join gives it back, uncopied
        if last:
            self.transport.close()
            server.end(self)

    def flood(self) -> None:
        batch = self.server.flood_batch
        while not self.paused and not self.closed and self.sent < self.server.events:
            self.write_events(batch)


class Server:
    def __init__(self, *, events: int, interval_s: float, flood_batch: int = 1) -> None:
        self.events = events
        self.interval_s = interval_s
        self.flood_batch = flood_batch
        self.stats = Stats()
        self.active: dict[int, Stream] = {}

    def begin(self, stream: Stream) -> None:
        assert stream.transport is not None
        stream.transport.write(_HEAD)
        self.active[id(stream)] = stream
        self.stats.open += 1
        self.stats.started += 1
        if self.interval_s == 0:
            stream.flood()

    def end(self, stream: Stream) -> None:
        if self.active.pop(id(stream), None) is not None:
            self.stats.open -= 1
            self.stats.finished += 1

    async def tick(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            for stream in list(self.active.values()):
                transport = stream.transport
                # Only into a writable socket: nothing waits in user space for a slow reader.
                if transport is not None and not stream.closed:
                    if transport.get_write_buffer_size() == 0:
                        stream.write_events()

    async def report(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            s = self.stats
            line = {"t": round(time.monotonic(), 3), "open": s.open, "started": s.started,
                    "finished": s.finished, "events": s.events}  # fmt: skip
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()


async def serve(args: argparse.Namespace) -> None:
    server = Server(
        events=args.events, interval_s=args.interval_ms / 1000.0, flood_batch=args.flood_batch
    )
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(
        lambda: Stream(server), args.host, args.port, backlog=args.backlog, reuse_address=True
    )
    port = listener.sockets[0].getsockname()[1]
    sys.stdout.write(json.dumps({"listening": port}) + "\n")
    sys.stdout.flush()
    tasks = [asyncio.create_task(server.report(args.stats_interval_s))]
    if server.interval_s > 0:
        tasks.append(asyncio.create_task(server.tick()))
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--events", type=int, default=1000, help="chunks per stream")
    parser.add_argument("--interval-ms", type=float, default=5.0, help="0: as fast as possible")
    parser.add_argument(
        "--flood-batch", type=int, default=16, help="chunks per write at --interval-ms 0"
    )
    parser.add_argument("--stats-interval-s", type=float, default=1.0)
    parser.add_argument("--backlog", type=int, default=4096)
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args(argv)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.loop == "uvloop":
        import uvloop

        uvloop.install()
    try:
        asyncio.run(serve(args))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
