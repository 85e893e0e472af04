"""One client connection of the egress buffer: its state, and closing it gracefully.

A ``Client`` holds what every part of the proxy needs about one connection: its asyncio
stream and transport (whose write buffer is the stream's host-memory buffer), its h11 state,
the upstream connection of the response in progress, and the write-progress bookkeeping the
stall watchdog (``_watchdog``) reads and updates: bytes written, bytes the client acknowledged
(``tcpi_bytes_acked``) and when that last grew.
"""

from __future__ import annotations

import asyncio
import time

import h11

READ_CHUNK = 64 * 1024
"""Bytes per read from either side."""
MAX_ACKED_SAMPLES = 500
ACKED_SAMPLE_S = 0.5
"""Samples of acknowledged bytes kept per connection: at most one per ``ACKED_SAMPLE_S`` of
growth, ``MAX_ACKED_SAMPLES`` in all (about 4 minutes of a stream; a few KiB of memory)."""
LINGER_S = 1.0
LINGER_BYTES = 256 * 1024
"""After an error response, the request bytes still arriving are read and discarded for at
most this long / this much before closing, so the response is not lost to a RST (closing a
socket with unread data resets it)."""


class Client:
    """One client connection: its streams, h11 state and write-progress bookkeeping."""

    __slots__ = (
        "reader",
        "writer",
        "transport",
        "sock",
        "conn",
        "task",
        "peer",
        "written",
        "acked",
        "acked_over_time",
        "t_open",
        "checked",
        "last_progress",
        "stall_start",
        "cut_reason",
        "t_cut",
        "upstream",
        "client_closed",
        "idle",
        "peak",
    )

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        max_header_bytes: int,
    ) -> None:
        self.reader = reader
        self.writer = writer
        self.transport = writer.transport
        self.sock = writer.get_extra_info("socket")
        self.conn = h11.Connection(h11.SERVER, max_incomplete_event_size=max_header_bytes)
        self.task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        self.written = 0  # bytes handed to the transport
        self.acked = 0  # bytes the client had acknowledged at the last watchdog tick
        self.acked_over_time: list[tuple[float, int]] = []  # (monotonic s, acked) on growth
        self.t_open = time.monotonic()
        self.last_progress = self.checked = self.t_open  # monotonic s
        self.stall_start: float | None = None
        self.cut_reason: str | None = None
        self.t_cut: float | None = None
        self.upstream: asyncio.WriteTransport | None = None  # while a response is unfinished
        self.client_closed = False
        self.idle = True  # waiting for the first byte of a request
        self.peak = 0

    def record(self) -> dict[str, object]:
        """The connection's line in the clients log (``EgressConfig.clients_log``): times in
        monotonic s, sizes in bytes; ``acked`` lists ``[t, bytes acknowledged]`` at each
        watchdog tick that saw them grow (at most one per ``ACKED_SAMPLE_S``, and
        ``MAX_ACKED_SAMPLES``)."""
        return {
            "peer": self.peer, "t_open": self.t_open, "t_end": time.monotonic(),
            "bytes_written": self.written, "bytes_acked": self.acked,
            "t_last_progress": self.last_progress, "cut_reason": self.cut_reason,
            "t_cut": self.t_cut, "acked": [list(x) for x in self.acked_over_time],
        }  # fmt: skip

    def write(self, data: bytes) -> None:
        """Hand ``data`` to the transport (no-op once the connection is closing)."""
        if self.transport.is_closing():
            return
        self.transport.write(data)
        self.written += len(data)
        size = self.transport.get_write_buffer_size()
        if size > self.peak:
            self.peak = size


async def linger_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Send FIN after the pending response, discard what the client still sends for a
    short while, then close (an error response is not lost to a RST)."""
    try:
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(LINGER_S):
            received = 0
            while received < LINGER_BYTES:
                data = await reader.read(READ_CHUNK)
                if not data:
                    break
                received += len(data)
    except (TimeoutError, OSError, RuntimeError):
        pass
    finally:
        writer.close()
