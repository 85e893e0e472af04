"""The ``leave`` action on real loopback sockets: what the server's end of the connection sees.

A one-shot server reads the request, sends the response head and one event only after
``first_event_s`` (a slow prefill), then one event every 20 ms; it records what its socket
saw: end of file (FIN), ECONNRESET (RST), or nothing at all. A client that leaves before the
first event must be seen by the server as the style says, and a vanished client not at all.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
import time

import pytest
from pydantic import ValidationError

from loadgen import Leave, RequestSpec, stream_request
from loadgen._vanish import TABLE_PREFIX, release


class WatchingServer:
    """Serve one streaming request; ``seen`` becomes ``"fin"``, ``"rst"`` or stays ``None``
    (nothing heard from the client) within ``watch_s`` of the first event."""

    def __init__(self, *, first_event_s: float, watch_s: float = 2.0) -> None:
        self.first_event_s = first_event_s
        self.watch_s = watch_s
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.seen: str | None = None
        self.t_seen: float | None = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        sock, _ = self.listener.accept()
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(65536)
        sock.settimeout(0.02)
        end = time.monotonic() + self.first_event_s + self.watch_s
        next_event = time.monotonic() + self.first_event_s
        head_sent = False
        n = 0
        while time.monotonic() < end and self.seen is None:
            try:
                got = sock.recv(65536)
                if not got:
                    self.seen, self.t_seen = "fin", time.monotonic()
            except TimeoutError:
                pass
            except ConnectionResetError:
                self.seen, self.t_seen = "rst", time.monotonic()
            if self.seen is None and time.monotonic() >= next_event:
                n += 1
                payload = {"choices": [{"index": 0, "text": " tok"}],
                           "usage": {"completion_tokens": n, "prompt_tokens": 4}}  # fmt: skip
                event = f"data: {json.dumps(payload)}\n\n".encode()
                head = b"" if head_sent else (
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                    b"Transfer-Encoding: chunked\r\n\r\n"
                )  # fmt: skip
                head_sent = True
                try:
                    sock.send(head + f"{len(event):x}\r\n".encode() + event + b"\r\n")
                except ConnectionResetError:
                    self.seen, self.t_seen = "rst", time.monotonic()
                except (BlockingIOError, TimeoutError, BrokenPipeError):
                    pass
                next_event += 0.02
        sock.close()

    def join(self) -> None:
        self.thread.join(timeout=self.first_event_s + self.watch_s + 5)


def _spec(url: str, action: Leave) -> RequestSpec:
    return RequestSpec(
        host=url, model="m", prompt="p", prompt_tokens=1, max_tokens=1000, timeout_s=20,
        action=action,
    )  # fmt: skip


@pytest.mark.parametrize(("how", "seen"), [("fin", "fin"), ("rst", "rst")])
def test_leave_before_the_first_token_reaches_the_server(how: str, seen: str) -> None:
    server = WatchingServer(first_event_s=1.5)
    record = stream_request(_spec(server.url, Leave(after_s=0.3, how=how)))
    server.join()
    assert record.outcome == "client_abort"
    assert record.action == "leave" and record.t_action is not None
    assert record.t_action - record.t_send == pytest.approx(0.3, abs=0.2)
    assert record.t_first_token is None  # it left during the "prefill"
    assert server.seen == seen
    assert server.t_seen is not None and server.t_seen - record.t_action < 0.5


def test_leave_after_tokens_with_a_stall_then_rst() -> None:
    server = WatchingServer(first_event_s=0.1, watch_s=3.0)
    record = stream_request(_spec(server.url, Leave(after_tokens=3, how="stall_rst", stall_s=0.8)))
    server.join()
    assert record.outcome == "client_abort"
    assert record.completion_tokens >= 3
    assert server.seen == "rst"
    assert server.t_seen is not None and record.t_action is not None
    assert server.t_seen - record.t_action == pytest.approx(0.8, abs=0.4)


@pytest.mark.skipif(shutil.which("nft") is None, reason="vanish needs nft")
def test_a_vanished_client_sends_neither_fin_nor_rst_until_released() -> None:
    server = WatchingServer(first_event_s=0.1, watch_s=2.0)
    record = stream_request(_spec(server.url, Leave(after_tokens=2, how="vanish")))
    assert record.outcome == "client_abort" and record.error is None
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert TABLE_PREFIX in tables
    server.join()
    assert server.seen is None  # two seconds of events went nowhere, and no FIN or RST came
    release()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    assert TABLE_PREFIX not in tables


def test_leave_after_the_first_token_and_a_wait() -> None:
    # The first event comes after a 0.6 s "queue": the client leaves 0.4 s after it, not
    # 0.4 s after its send.
    server = WatchingServer(first_event_s=0.6)
    record = stream_request(_spec(server.url, Leave(after_tokens=1, wait_s=0.4, how="fin")))
    server.join()
    assert record.outcome == "client_abort" and record.action == "leave"
    assert record.t_first_token is not None and record.t_action is not None
    assert record.t_first_token - record.t_send == pytest.approx(0.6, abs=0.2)
    assert record.t_action - record.t_first_token == pytest.approx(0.4, abs=0.15)
    assert server.seen == "fin"
    assert server.t_seen is not None and server.t_seen - record.t_action < 0.5


def test_leave_validation() -> None:
    with pytest.raises(ValidationError, match="not both"):
        Leave(after_s=1, after_tokens=2)
    with pytest.raises(ValidationError, match="not with after_s"):
        Leave(after_s=1, wait_s=0.5)
    assert Leave(after_tokens=1, wait_s=0.5, how="stall_fin", stall_s=1).pause_s == 1.5
    with pytest.raises(ValidationError, match="needs stall_s"):
        Leave(how="stall_fin")
    with pytest.raises(ValidationError, match="stall_s is for"):
        Leave(how="rst", stall_s=1)
