"""The client's response framing (httptools) on scripted raw responses: sized, chunked and
close-delimited bodies, an informational response first, truncated and malformed bodies,
events split at every byte across writes, and the request deadline under gevent."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen import RequestSpec, stream_request

ROOT = Path(__file__).resolve().parent.parent


def _event(i: int, *, eol: bytes = b"\n") -> bytes:
    obj = {
        "id": "cmpl-t",
        "choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}],
        "usage": {"prompt_tokens": 1, "completion_tokens": i + 1},
    }
    return b"data: " + json.dumps(obj).encode() + eol + eol


def _sse(n: int, *, eol: bytes = b"\n") -> bytes:
    return b"".join(_event(i, eol=eol) for i in range(n)) + b"data: [DONE]" + eol + eol


def _chunked(body: bytes, size: int = 97) -> bytes:
    parts = [body[i : i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"


class OneShot:
    """Answers one request with ``pieces`` (written one by one, ``gap_s`` apart), then closes."""

    def __init__(self, pieces: list[bytes], gap_s: float = 0.0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, args=(pieces, gap_s), daemon=True)
        self.thread.start()

    def _serve(self, pieces: list[bytes], gap_s: float) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(65536)
            for piece in pieces:
                conn.sendall(piece)
                if gap_s:
                    time.sleep(gap_s)
            conn.shutdown(socket.SHUT_WR)
            time.sleep(0.2)
        self.sock.close()


@pytest.fixture
def one_shot() -> Iterator[type[OneShot]]:
    yield OneShot


def _spec(url: str, **kw: object) -> RequestSpec:
    return RequestSpec(host=url, model="m", prompt="p", prompt_tokens=1, timeout_s=10, **kw)  # type: ignore[arg-type]


def test_chunked_body_split_at_every_byte_keeps_every_event(one_shot: type[OneShot]) -> None:
    wire = _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_sse(5))
    server = one_shot([wire[i : i + 1] for i in range(len(wire))])
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "complete", rec.error
    assert [c.text for c in rec.chunks] == [f"t{i}" for i in range(5)]
    assert rec.completion_tokens == 5
    assert sum(c.bytes for c in rec.chunks) == len(_sse(5)) - len(b"data: [DONE]\n\n")


def test_sized_body_with_crlf_events(one_shot: type[OneShot]) -> None:
    body = _sse(4, eol=b"\r\n")
    server = one_shot([_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body])
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "complete", rec.error
    assert [c.tokens for c in rec.chunks] == [1, 1, 1, 1]


def test_close_delimited_body_ends_at_eof(one_shot: type[OneShot]) -> None:
    server = one_shot([_HEAD + b"\r\n", _sse(3)], gap_s=0.05)
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "complete", rec.error
    assert rec.completion_tokens == 3


def test_informational_response_before_the_real_one(one_shot: type[OneShot]) -> None:
    wire = b"HTTP/1.1 103 Early Hints\r\nlink: </x>\r\n\r\n"
    wire += _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_sse(2))
    server = one_shot([wire])
    rec = stream_request(_spec(server.url))
    assert (rec.outcome, rec.http_status) == ("complete", 200), rec.error


def test_eof_inside_a_chunked_body_is_a_cut(one_shot: type[OneShot]) -> None:
    wire = _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_sse(4))
    server = one_shot([wire[: len(wire) // 2]])
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "cut_by_peer"
    assert rec.cut_kind == "fin" and rec.t_cut_seen is not None
    assert 0 < len(rec.chunks) < 4


def test_eof_after_a_complete_message_without_done_is_a_cut(one_shot: type[OneShot]) -> None:
    body = _event(0)
    server = one_shot([_HEAD + b"content-length: %d\r\n\r\n" % len(body) + body])
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "cut_by_peer"
    assert rec.error == "response ended without [DONE]"


def test_malformed_chunk_size_is_an_http_error(one_shot: type[OneShot]) -> None:
    wire = _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_event(0))[:-5] + b"zz\r\n"
    server = one_shot([wire])
    rec = stream_request(_spec(server.url))
    assert rec.outcome == "http_error"
    assert rec.error is not None and "protocol error" in rec.error
    assert len(rec.chunks) == 1  # what came before the bad bytes is kept


def test_error_body_of_a_non_200_is_recorded(one_shot: type[OneShot]) -> None:
    body = b'{"error": "overloaded"}'
    wire = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: %d\r\n\r\n" % len(body) + body
    server = one_shot([wire])
    rec = stream_request(_spec(server.url))
    assert (rec.outcome, rec.http_status) == ("http_error", 503)
    assert rec.error == 'HTTP 503: {"error": "overloaded"}'


_UNDER_GEVENT = """
from gevent import monkey; monkey.patch_all()
import json, socket, sys, time, gevent
from loadgen import RequestSpec, stream_request
from loadgen._gevent_recv import WaitFirstRecv
sys.path.insert(0, "tests")
from test_client_framing import _HEAD, _chunked, _sse
srv = socket.create_server(("127.0.0.1", 0))
def serve(stall):
    c, _ = srv.accept(); c.recv(65536)
    c.sendall(_HEAD + b"transfer-encoding: chunked\\r\\n\\r\\n")
    if stall:
        gevent.sleep(30)
    for piece in _chunked(_sse(20), size=50).split(b"\\r\\n\\r\\n"):
        c.sendall(piece + b"\\r\\n\\r\\n" if piece else b"")
        gevent.sleep(0.01)
    c.close()
url = "http://127.0.0.1:%d" % srv.getsockname()[1]
wait_first = all(WaitFirstRecv.of(socket.socket(), m) for m in ("recv", "recvmsg"))
out = {"socket": socket.socket.__module__, "wait_first": wait_first}
for stall in (False, True):
    gevent.spawn(serve, stall)
    t0 = time.monotonic()
    spec = RequestSpec(host=url, model="m", prompt="p", prompt_tokens=1, timeout_s=1.0)
    rec = stream_request(spec)
    out[str(stall)] = [rec.outcome, rec.http_status, rec.completion_tokens, time.monotonic() - t0]
    out["timestamps" + str(stall)] = rec.timestamps
print(json.dumps(out))
"""


def test_under_gevent_reads_wait_first_and_the_deadline_is_one_timer() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _UNDER_GEVENT], cwd=ROOT, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["socket"].startswith("gevent") and out["wait_first"]
    outcome, status, tokens, _ = out["False"]
    assert (outcome, status, tokens) == ("complete", 200, 20)
    assert out["timestampsFalse"] == "kernel"  # the first request of the process too
    outcome, status, tokens, elapsed_s = out["True"]
    assert (outcome, status, tokens) == ("timeout", 200, 0)
    assert 0.9 < elapsed_s < 5.0


def test_done_then_close_before_the_last_chunk_is_complete(one_shot: type[OneShot]) -> None:
    wire = _HEAD + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_sse(2))
    server = one_shot([wire[: -len(b"0\r\n\r\n")]])
    rec = stream_request(_spec(server.url))
    assert (rec.outcome, rec.error, rec.cut_kind) == ("complete", None, None)


@pytest.mark.parametrize(
    ("content_type", "shown"),
    [(b"content-type: text/plain\r\n", "text/plain"), (b"", "none")],
)
def test_a_200_that_is_not_an_event_stream_is_not_sse(
    one_shot: type[OneShot], content_type: bytes, shown: str
) -> None:
    body = b"model overloaded, try later"
    wire = b"HTTP/1.1 200 OK\r\n" + content_type + b"content-length: %d\r\n\r\n" % len(body)
    rec = stream_request(_spec(one_shot([wire + body]).url))
    assert (rec.outcome, rec.http_status) == ("not_sse", 200)
    expected = f"HTTP 200 with Content-Type {shown}, not text/event-stream: {body.decode()}"
    assert rec.error == expected


def test_an_event_stream_with_parameters_or_a_wrong_type_that_completes_is_complete(
    one_shot: type[OneShot],
) -> None:
    for head in (
        b"HTTP/1.1 200 OK\r\ncontent-type: Text/Event-Stream; charset=utf-8\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n",  # SSE under the wrong type
    ):
        wire = head + b"transfer-encoding: chunked\r\n\r\n" + _chunked(_sse(3))
        rec = stream_request(_spec(one_shot([wire]).url))
        assert (rec.outcome, rec.error, rec.completion_tokens) == ("complete", None, 3)


def test_a_gzip_stream_is_decoded_event_by_event_and_brotli_is_named(
    one_shot: type[OneShot],
) -> None:
    import zlib

    gz = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    pieces = [gz.compress(_event(i)) + gz.flush(zlib.Z_SYNC_FLUSH) for i in range(3)]
    pieces.append(gz.compress(b"data: [DONE]\n\n") + gz.flush())
    head = _HEAD + b"content-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n"
    server = one_shot([head, *(_chunked(p)[:-5] for p in pieces), b"0\r\n\r\n"], gap_s=0.02)
    rec = stream_request(_spec(server.url, accept_encoding="gzip"))
    assert rec.outcome == "complete", rec.error
    assert rec.content_encoding == "gzip" and [c.text for c in rec.chunks] == ["t0", "t1", "t2"]
    assert len({c.t for c in rec.chunks}) == 3  # each event when its flush arrived
    server = one_shot([_HEAD + b"content-encoding: br\r\n\r\n", b"\x0b\x02\x80"])
    rec = stream_request(_spec(server.url, accept_encoding="br"))
    assert rec.outcome == "not_sse" and "Content-Encoding br: the client decodes gzip" in rec.error
