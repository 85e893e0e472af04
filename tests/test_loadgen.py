"""The load generator against a small real streaming server on 127.0.0.1 (real sockets).

The server below is a test fixture, not an engine emulator: one thread per connection, h11
framing, OpenAI-style SSE completion chunks with continuous usage stats, and a log of what it
saw per connection (Send-Q samples via ``ioctl(TIOCOUTQ)``, time blocked in ``sendall``, how
the connection ended).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import h11
import pytest

from loadgen import (
    AbortiveClose,
    FullSpeed,
    GroupRunConfig,
    HalfClose,
    Paced,
    RequestRecord,
    RequestSpec,
    Stall,
    StopReading,
    UserGroupConfig,
    read_records,
    stream_request,
)

REPO = Path(__file__).resolve().parents[1]


@dataclass
class ConnLog:
    peer_port: int
    t_accept: float
    body: dict[str, Any] = field(default_factory=dict)
    bytes_sent: int = 0
    max_outq_bytes: int = 0
    max_send_block_s: float = 0.0
    end: str = ""  # "complete", "cut", or the exception class that ended the connection
    t_end: float | None = None


@dataclass
class Script:
    """What the server does with each request."""

    tokens_per_chunk: int = 1
    delay_s: float = 0.0  # between chunks
    pad_bytes: int = 0  # extra text per chunk, to make chunks bigger on the wire
    cut_after_chunks: int | None = None  # close the connection mid-stream
    error_after_chunks: int | None = None  # send an error event, then [DONE]
    status: int = 200
    fail_every: int | None = None  # every n-th request gets a 500
    hang_after_chunks: int | None = None  # stop sending, keep the connection open
    sndbuf_bytes: int | None = None
    chat: bool = False


class StreamServer:
    """Threaded HTTP/1.1 server on 127.0.0.1, port 0, streaming completions per :class:`Script`."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.conns: list[ConnLog] = []
        self._n_requests = 0
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def close(self) -> None:
        self._closing.set()
        self.listener.close()
        for s in self._socks:
            try:
                s.close()
            except OSError:
                pass

    def conn_for(self, record: RequestRecord) -> ConnLog:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for c in self.conns:
                if c.peer_port == record.client_port and c.t_end is not None:
                    return c
            time.sleep(0.01)
        raise AssertionError(f"server saw no finished connection from port {record.client_port}")

    def _accept_loop(self) -> None:
        while not self._closing.is_set():
            try:
                sock, peer = self.listener.accept()
            except OSError:
                return
            log = ConnLog(peer_port=peer[1], t_accept=time.monotonic())
            with self._lock:
                self.conns.append(log)
                self._socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, log), daemon=True).start()

    def _send(self, sock: socket.socket, log: ConnLog, data: bytes) -> None:
        t0 = time.monotonic()
        sock.sendall(data)
        log.max_send_block_s = max(log.max_send_block_s, time.monotonic() - t0)
        log.bytes_sent += len(data)
        outq = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]
        log.max_outq_bytes = max(log.max_outq_bytes, outq)

    def _serve(self, sock: socket.socket, log: ConnLog) -> None:
        s = self.script
        if s.sndbuf_bytes:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, s.sndbuf_bytes)
        conn = h11.Connection(h11.SERVER)
        body = b""
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(sock.recv(65536))
                elif isinstance(event, h11.Data):
                    body += event.data
                elif isinstance(event, h11.EndOfMessage):
                    break
            log.body = json.loads(body)
            with self._lock:
                self._n_requests += 1
                n = self._n_requests
            failing = s.status != 200 or (s.fail_every is not None and n % s.fail_every == 0)
            if failing:
                self._error_response(sock, conn, log, s.status if s.status != 200 else 500)
            else:
                self._stream(sock, conn, log)
        except (OSError, ValueError) as e:  # ValueError: socket closed by StreamServer.close()
            log.end = type(e).__name__
        finally:
            log.t_end = time.monotonic()
            sock.close()

    def _error_response(
        self, sock: socket.socket, conn: h11.Connection, log: ConnLog, status: int
    ) -> None:
        payload = json.dumps({"error": {"message": "fixture failure", "code": status}}).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(payload)))]
        wire = conn.send(h11.Response(status_code=status, headers=headers))
        wire += conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
        self._send(sock, log, wire)
        log.end = "complete"

    def _stream(self, sock: socket.socket, conn: h11.Connection, log: ConnLog) -> None:
        s = self.script
        max_tokens = int(log.body["max_tokens"])
        headers = [("Content-Type", "text/event-stream"), ("Transfer-Encoding", "chunked")]
        self._send(sock, log, conn.send(h11.Response(status_code=200, headers=headers)))

        def event(obj: Any) -> None:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            self._send(sock, log, conn.send(h11.Data(data=f"data: {data}\n\n".encode())))

        done_tokens = 0
        n_chunks = 0
        while done_tokens < max_tokens:
            if n_chunks == s.cut_after_chunks:
                sock.shutdown(socket.SHUT_RDWR)
                log.end = "cut"
                return
            if n_chunks == s.error_after_chunks:
                event({"error": {"message": "fixture engine died", "code": 500}})
                event("[DONE]")
                self._send(sock, log, conn.send(h11.EndOfMessage()))
                log.end = "complete"
                return
            if n_chunks == s.hang_after_chunks:
                while sock.recv(65536):  # until the client closes
                    pass
                log.end = "client closed"
                return
            k = min(s.tokens_per_chunk, max_tokens - done_tokens)
            done_tokens += k
            text = " tok" * k + "x" * s.pad_bytes
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}, "finish_reason": None}
                if s.chat
                else {"index": 0, "text": text, "finish_reason": None}
            )
            if done_tokens == max_tokens:
                choice["finish_reason"] = "length"
            usage = {"prompt_tokens": 7, "completion_tokens": done_tokens}
            event({"id": "cmpl-1", "choices": [choice], "usage": usage})
            n_chunks += 1
            if s.delay_s:
                time.sleep(s.delay_s)
        event(
            {
                "id": "cmpl-1",
                "choices": [],
                "usage": {"prompt_tokens": 7, "completion_tokens": done_tokens},
            }
        )
        event("[DONE]")
        self._send(sock, log, conn.send(h11.EndOfMessage()))
        log.end = "complete"


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[StreamServer] = []

    def start(**kwargs: Any) -> StreamServer:
        server = StreamServer(Script(**kwargs))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


def spec(server: StreamServer, **kwargs: Any) -> RequestSpec:
    base: dict[str, Any] = {
        "host": server.url,
        "model": "tiny",
        "prompt": "hello world",
        "prompt_tokens": 2,
        "max_tokens": 16,
        "timeout_s": 10.0,
    }
    base.update(kwargs)
    return RequestSpec(**base)


# --- full-speed reading -----------------------------------------------------------------------


def test_full_speed_gets_every_token(serve: Any) -> None:
    server = serve()
    rec = stream_request(spec(server, max_tokens=20, group="g", user_class="U"))
    assert rec.outcome == "complete", rec.error
    assert rec.http_status == 200
    assert rec.completion_tokens == 20 and rec.prompt_tokens == 7
    assert [c.tokens for c in rec.chunks] == [1] * 20
    assert "".join(c.text for c in rec.chunks) == " tok" * 20
    assert rec.finish_reason == "length"
    assert rec.t_send <= rec.t_first_byte <= rec.t_first_token <= rec.t_last_byte <= rec.t_end  # type: ignore[operator]
    assert rec.bytes_received > sum(c.bytes for c in rec.chunks) > 0
    assert rec.client_addr == "127.0.0.1" and rec.client_port
    conn = server.conn_for(rec)
    assert conn.end == "complete"
    assert conn.body["stream"] is True and conn.body["ignore_eos"] is True
    assert conn.body["stream_options"]["continuous_usage_stats"] is True


def test_chunk_carrying_k_tokens_counts_k(serve: Any) -> None:
    server = serve(tokens_per_chunk=3)
    rec = stream_request(spec(server, max_tokens=10))
    assert rec.outcome == "complete"
    assert [c.tokens for c in rec.chunks] == [3, 3, 3, 1]
    assert rec.completion_tokens == 10


def test_chat_endpoint(serve: Any) -> None:
    server = serve(chat=True)
    rec = stream_request(spec(server, endpoint="chat", max_tokens=5))
    assert rec.outcome == "complete" and rec.completion_tokens == 5
    assert server.conn_for(rec).body["messages"][0]["content"] == "hello world"


# --- slow reading -----------------------------------------------------------------------------


def test_paced_reader_is_slower_and_backs_up_the_server(serve: Any) -> None:
    # ~18.6 KB in all: more than the client's receive buffer (4 KiB asked, 8 KiB granted) and
    # the server's Send-Q (~4 KB) hold together, however the kernel packs loopback segments, so
    # the server's writes must block. (With half of it, 9.3 KB, they sometimes fit.)
    server = serve(pad_bytes=150, sndbuf_bytes=1024)
    fast = stream_request(spec(server, max_tokens=60))
    paced = Paced(bytes_per_read=128, interval_s=0.05)
    slow = stream_request(spec(server, max_tokens=60, read=paced, rcvbuf_bytes=4096))
    assert fast.outcome == slow.outcome == "complete"
    assert slow.completion_tokens == 60
    fast_s = fast.t_end - fast.t_send  # type: ignore[operator]
    slow_s = slow.t_end - slow.t_send  # type: ignore[operator]
    # ~18.6 KB at 128 B per 50 ms is ~7 s; allow generous slack either way.
    assert slow_s > 4.0, (fast_s, slow_s)
    assert fast_s < min(2.0, slow_s / 3), (fast_s, slow_s)
    # The pace holds at the socket: never more than bytes_per_read per recv.
    min_reads = slow.bytes_received / 128
    assert slow_s >= (min_reads - 1) * 0.05 * 0.9
    fast_conn, slow_conn = server.conn_for(fast), server.conn_for(slow)
    assert slow_conn.max_outq_bytes > 2000, slow_conn  # data waited in the server's Send-Q
    assert slow_conn.max_send_block_s > 0.5, slow_conn  # and its write blocked (zero window)
    assert fast_conn.max_send_block_s < 0.5, fast_conn


def test_stall_pauses_then_resumes(serve: Any) -> None:
    server = serve(delay_s=0.01)
    rec = stream_request(spec(server, max_tokens=20, action=Stall(after_tokens=5, stall_s=0.5)))
    assert rec.outcome == "complete" and rec.completion_tokens == 20
    assert rec.action == "stall" and len(rec.stalls) == 1
    start, end = rec.stalls[0]
    assert start is not None and end is not None and 0.45 <= end - start <= 1.5
    gap = [b.t - a.t for a, b in zip(rec.chunks, rec.chunks[1:], strict=False)]
    assert max(gap) >= 0.45


def test_stop_reading_holds_then_closes(serve: Any) -> None:
    server = serve(pad_bytes=100)
    action = StopReading(after_tokens=3, hold_s=1.0, close="fin")
    rec = stream_request(
        spec(
            server,
            max_tokens=100_000,
            read=Paced(bytes_per_read=256, interval_s=0.01),
            rcvbuf_bytes=4096,
            action=action,
        )
    )
    assert rec.outcome == "client_abort", rec.error
    assert rec.action == "stop_reading" and rec.t_action is not None
    assert len(rec.stalls) == 1 and rec.stalls[0][1] is None  # never resumed
    assert 0.9 <= rec.t_end - rec.t_action <= 2.0  # type: ignore[operator]
    conn = server.conn_for(rec)
    assert conn.t_end is not None
    assert conn.t_end - rec.t_action >= 0.9  # the connection stayed open while held
    assert conn.end in {"ConnectionResetError", "BrokenPipeError"}
    assert rec.completion_tokens < 1000  # it really stopped reading


def test_stop_reading_with_rst(serve: Any) -> None:
    server = serve(delay_s=0.02)
    action = StopReading(after_tokens=2, hold_s=0.3, close="rst")
    rec = stream_request(spec(server, max_tokens=1000, action=action))
    assert rec.outcome == "client_abort"
    assert server.conn_for(rec).end == "ConnectionResetError"


def test_abortive_close_resets_the_server(serve: Any) -> None:
    server = serve(delay_s=0.02)
    rec = stream_request(spec(server, max_tokens=1000, action=AbortiveClose(after_tokens=5)))
    assert rec.outcome == "client_abort" and rec.action == "abortive_close"
    assert 5 <= rec.completion_tokens < 50
    conn = server.conn_for(rec)
    assert conn.end == "ConnectionResetError"
    assert conn.t_end - rec.t_end < 1.0


def test_half_close_keeps_reading(serve: Any) -> None:
    server = serve(delay_s=0.005)
    rec = stream_request(spec(server, max_tokens=20, action=HalfClose(after_tokens=3)))
    assert rec.action == "half_close"
    assert rec.outcome == "complete" and rec.completion_tokens == 20  # this server ignores EOF


# --- failures ---------------------------------------------------------------------------------


def test_server_closing_mid_stream_is_cut_by_peer(serve: Any) -> None:
    server = serve(cut_after_chunks=4)
    rec = stream_request(spec(server, max_tokens=20))
    assert rec.outcome == "cut_by_peer"
    assert rec.completion_tokens == 4 and rec.error


def test_http_500_is_http_error(serve: Any) -> None:
    server = serve(status=500)
    rec = stream_request(spec(server))
    assert rec.outcome == "http_error" and rec.http_status == 500
    assert rec.error is not None and "fixture failure" in rec.error


def test_error_event_is_server_error_event(serve: Any) -> None:
    server = serve(error_after_chunks=3)
    rec = stream_request(spec(server, max_tokens=20))
    assert rec.outcome == "server_error_event"
    assert rec.error is not None and "fixture engine died" in rec.error
    assert rec.completion_tokens == 3


def test_deadline_gives_timeout(serve: Any) -> None:
    server = serve(hang_after_chunks=2)
    rec = stream_request(spec(server, max_tokens=20, timeout_s=0.5))
    assert rec.outcome == "timeout"
    assert 0.45 <= rec.t_end - rec.t_send <= 1.5  # type: ignore[operator]
    assert rec.completion_tokens == 2


def test_refused_connection() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    rec = stream_request(
        RequestSpec(host=f"http://127.0.0.1:{port}", model="m", prompt="p", prompt_tokens=1)
    )
    assert rec.outcome == "cut_by_peer" and "Refused" in (rec.error or "")


# --- configuration ----------------------------------------------------------------------------


def test_group_config_validation() -> None:
    group = UserGroupConfig.model_validate(
        {"name": "slow", "users": 2, "requests_per_user": 1,
         "read": {"kind": "paced", "bytes_per_read": 32},
         "action": {"kind": "stop_reading", "after_tokens": 4, "hold_s": 5, "close": "rst"}}
    )  # fmt: skip
    assert isinstance(group.read, Paced) and isinstance(group.action, StopReading)
    assert isinstance(UserGroupConfig(name="x", users=1, requests_per_user=1).read, FullSpeed)
    with pytest.raises(ValueError, match="full_speed"):
        UserGroupConfig.model_validate(
            {"name": "x", "users": 1, "requests_per_user": 1, "read": {"kind": "nope"}}
        )
    with pytest.raises(ValueError, match="shorter than timeout_s"):
        UserGroupConfig(
            name="x", users=1, requests_per_user=1, timeout_s=5,
            action=StopReading(after_tokens=1, hold_s=10),
        )  # fmt: skip
    with pytest.raises(ValueError):
        UserGroupConfig.model_validate({"name": "x", "users": 0, "requests_per_user": 1})


# --- the real Locust CLI ----------------------------------------------------------------------


def run_locust(
    tmp_path: Path, group: UserGroupConfig, url: str, *extra: str
) -> tuple[subprocess.CompletedProcess[str], list[RequestRecord], float]:
    records = tmp_path / "records.jsonl"
    run = GroupRunConfig(group=group, host=url, model="tiny", records_path=records, seed=3)
    config = tmp_path / "group.json"
    config.write_text(run.model_dump_json())
    users = str(group.users)
    cmd = [
        sys.executable, "-m", "locust", "-f", str(REPO / "loadgen" / "locustfile.py"),
        "--headless", "-u", users, "-r", users, "--zw-group-config", str(config),
        "--only-summary", "--loglevel", "WARNING", *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=45)
    elapsed = time.monotonic() - t0
    got = list(read_records(records)) if records.exists() else []
    return proc, got, elapsed


def test_locust_cli_runs_a_group_and_quits_by_itself(serve: Any, tmp_path: Path) -> None:
    server = serve(delay_s=0.01, fail_every=3)
    group = UserGroupConfig(
        name="slow-readers",
        users=2,
        requests_per_user=3,
        read=Paced(bytes_per_read=512, interval_s=0.01),
        rcvbuf_bytes=8192,
        max_tokens=12,
        timeout_s=20,
    )
    proc, got, elapsed = run_locust(tmp_path, group, server.url)  # no --run-time: quits itself
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(got) == 2 * 3
    outcomes = sorted(r.outcome for r in got)
    assert outcomes == ["complete"] * 4 + ["http_error"] * 2  # failures are data: still exit 0
    assert {r.group for r in got} == {"slow-readers"}
    assert {r.user_class for r in got} == {"slow_readers"}
    assert len({r.client_port for r in got}) == 6
    assert len({c.body["prompt"] for c in server.conns}) == 6  # distinct prompts
    assert elapsed < 30
    output = proc.stdout + proc.stderr
    assert "E2E" in output and "TTFT" in output


def test_locust_run_time_records_requests_in_flight(serve: Any, tmp_path: Path) -> None:
    server = serve(hang_after_chunks=1)
    group = UserGroupConfig(name="stuck", users=2, requests_per_user=5, timeout_s=60)
    proc, got, elapsed = run_locust(tmp_path, group, server.url, "--run-time", "2s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r.outcome for r in got] == ["client_abort"] * 2
    assert all(r.error == "interrupted: GreenletExit" and r.completion_tokens == 1 for r in got)
    assert elapsed < 20


PLAIN_LOCUSTFILE = """
from locust import events

from loadgen import Paced, SlowReaderUser, StopReading, quit_when_users_done


class Aggressor(SlowReaderUser):
    model = "tiny"
    read = Paced(bytes_per_read=128, interval_s=0.01)
    action = StopReading(after_tokens=3, hold_s=0.2, close="rst")
    requests_per_user = 2
    max_tokens = 500


@events.init.add_listener
def _quit_when_done(environment, **_kwargs):
    quit_when_users_done(environment)
"""


def test_plain_locustfile_with_class_attributes(serve: Any, tmp_path: Path) -> None:
    server = serve(delay_s=0.005)
    locustfile = tmp_path / "plain.py"
    locustfile.write_text(PLAIN_LOCUSTFILE)
    records = tmp_path / "out" / "records.jsonl"
    cmd = [
        sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", "-u", "1",
        "-r", "1", "--host", server.url, "--only-summary",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "ZW_RECORDS": str(records)}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=45)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = list(read_records(records))
    assert [(r.outcome, r.action, r.user_class, r.group) for r in got] == [
        ("client_abort", "stop_reading", "Aggressor", "Aggressor")
    ] * 2
    assert all(server.conn_for(r).end == "ConnectionResetError" for r in got)
