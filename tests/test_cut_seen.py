"""A holding client notices the server's RST or FIN without reading: ``t_cut_seen``/``cut_kind``.

A real socket server streams SSE chunks until the client's window closes, then cuts the
connection ``cut_after_s`` later, with RST (SO_LINGER 0) or with FIN (shutdown), and reports
when it did. The client stops reading (or stalls) and must see the cut long before its hold
would end.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time

import pytest

from loadgen import (
    TCP_CLOSE,
    TCP_CLOSE_WAIT,
    Paced,
    RequestSpec,
    Stall,
    StopReading,
    peer_cut,
    stream_request,
    tcp_state,
)


class CuttingServer:
    """One-shot HTTP server: streams up to ``max_chunks`` 1-token chunks for ``stream_s``, then
    cuts with ``how``."""

    def __init__(self, how: str, *, stream_s: float, max_chunks: int = 1_000_000) -> None:
        self.how = how
        self.stream_s = stream_s
        self.max_chunks = max_chunks
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.t_cut: float | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)
        sock.settimeout(0.05)
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        end = time.monotonic() + self.stream_s
        n = 0
        while time.monotonic() < end:
            if n >= self.max_chunks:
                time.sleep(0.01)
                continue
            n += 1
            payload = {"choices": [{"index": 0, "text": " tok" + "x" * 200}],
                       "usage": {"completion_tokens": n, "prompt_tokens": 4}}  # fmt: skip
            event = f"data: {json.dumps(payload)}\n\n".encode()
            try:
                sock.send(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            except (TimeoutError, BlockingIOError):
                time.sleep(0.01)  # the client's window is closed: drop the chunk, keep going
            except OSError:  # the client closed first
                sock.close()
                return
        if self.how == "rst":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.t_cut = time.monotonic()
            sock.close()
        else:
            self.t_cut = time.monotonic()
            sock.shutdown(socket.SHUT_WR)
            time.sleep(3)
            sock.close()

    def close(self) -> None:
        self.listener.close()


def _spec(url: str, action: object) -> RequestSpec:
    return RequestSpec(
        host=url, model="m", prompt="hi", prompt_tokens=1, max_tokens=100_000,
        read=Paced(bytes_per_read=256, interval_s=0.01), rcvbuf_bytes=4096,
        action=action, timeout_s=30,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.parametrize("how", ["rst", "fin"])
def test_stop_reading_client_sees_the_cut_while_holding(how: str) -> None:
    # A FIN travels in sequence after the data: it reaches a client that does not read only
    # if everything sent fits its receive buffer. A RST overtakes a closed window.
    server = CuttingServer(how, stream_s=1.0, max_chunks=1_000_000 if how == "rst" else 10)
    try:
        rec = stream_request(_spec(server.url, StopReading(after_tokens=3, hold_s=10)))
    finally:
        server.close()
    assert server.t_cut is not None
    assert rec.outcome == "cut_by_peer", rec.error
    assert rec.cut_kind == how
    assert rec.t_cut_seen is not None and rec.t_action is not None
    # Seen within a few poll intervals of the cut, not when the 10 s hold ends.
    assert 0 <= rec.t_cut_seen - server.t_cut < 0.5, rec.t_cut_seen - server.t_cut
    assert rec.t_end is not None and rec.t_end - rec.t_action < 3
    assert "while the client held" in (rec.error or "")


def test_stall_ends_at_the_cut_and_reads_what_was_left() -> None:
    server = CuttingServer("rst", stream_s=1.0)
    try:
        rec = stream_request(_spec(server.url, Stall(after_tokens=3, stall_s=10)))
    finally:
        server.close()
    assert rec.outcome == "cut_by_peer"
    assert rec.cut_kind == "rst" and rec.t_cut_seen is not None and server.t_cut is not None
    assert 0 <= rec.t_cut_seen - server.t_cut < 0.5
    start, end = rec.stalls[0]
    assert start is not None and end is not None and end - start < 3


def test_fin_behind_undelivered_data_is_not_seen_while_holding() -> None:
    server = CuttingServer("fin", stream_s=1.0)  # fills the window, then FIN behind the data
    try:
        rec = stream_request(_spec(server.url, StopReading(after_tokens=3, hold_s=2)))
    finally:
        server.close()
    assert rec.outcome == "client_abort" and rec.t_cut_seen is None


def test_uncut_hold_lasts_its_time() -> None:
    server = CuttingServer("rst", stream_s=2.5)
    try:
        rec = stream_request(_spec(server.url, StopReading(after_tokens=3, hold_s=0.5)))
    finally:
        server.close()
    assert rec.outcome == "client_abort" and rec.t_cut_seen is None and rec.cut_kind is None
    assert rec.t_end is not None and rec.t_action is not None
    assert 0.45 <= rec.t_end - rec.t_action < 2


def test_tcp_state_of_a_live_and_a_reset_connection() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    try:
        assert tcp_state(client) == 1 and peer_cut(client) is None  # ESTABLISHED
        peer.sendall(b"unread")  # unread data does not hide the RST
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()
        time.sleep(0.05)
        assert tcp_state(client) == TCP_CLOSE and peer_cut(client) == "rst"
        assert client.recv(100) == b"unread"  # and nothing was consumed
    finally:
        client.close()
        listener.close()
    assert tcp_state(client) is None


def test_fin_is_close_wait() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    try:
        peer.shutdown(socket.SHUT_WR)
        time.sleep(0.05)
        assert tcp_state(client) == TCP_CLOSE_WAIT and peer_cut(client) == "fin"
    finally:
        client.close()
        peer.close()
        listener.close()
