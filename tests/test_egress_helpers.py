"""Helpers shared by the egress buffer's tests (this module holds no tests).

Real sockets on loopback only: raw-socket HTTP clients whose reading the test controls, a
scripted upstream that misbehaves on purpose, and a metrics scraper that parses with
prometheus_client's parser.
"""

from __future__ import annotations

import errno
import json
import re
import select
import socket
import socketserver
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.test_sim_helpers import CLIENT

_VOLATILE = re.compile(rb'"id":"(?:chat)?cmpl-[0-9a-f-]+"|"created":\d+')


def mask_volatile(body: bytes) -> bytes:
    """``body`` with the per-request random id and the ``created`` timestamp blanked: the
    only bytes in which two runs of the same deterministic sim request differ."""
    return _VOLATILE.sub(b"~", body)


def egress_samples(url: str) -> dict[str, float]:
    """Every sample of the egress metrics endpoint ``url``, parsed with prometheus_client's
    parser, keyed ``name`` or ``name{label=value,...}`` (labels sorted)."""
    text = CLIENT.get(url).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return out


def completion_request(
    *, max_tokens: int, prompt: str = "egress", host: bytes = b"egress", stream: bool = True
) -> bytes:
    """A complete HTTP/1.1 streaming ``/v1/completions`` request (``ignore_eos``)."""
    body = json.dumps(
        {"model": "sim", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
         "stream": stream}
    ).encode()  # fmt: skip
    return (
        b"POST /v1/completions HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (host, len(body))
    ) + body


def raw_client(port: int, *, rcvbuf: int | None = None) -> socket.socket:
    """A TCP connection to 127.0.0.1:``port``, SO_RCVBUF set before connect when given."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", port))
    return sock


def read_head(sock: socket.socket) -> bytes:
    """Read byte by byte up to the end of a response head (nothing after it)."""
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        byte = sock.recv(1)
        if not byte:
            raise AssertionError(f"connection closed inside the response head: {head!r}")
        head += byte
    return head


def wait_reset(sock: socket.socket, *, timeout_s: float) -> float:
    """Wait, without reading, until the connection is reset or closed by the peer; returns
    the monotonic time it was seen. Raises AssertionError after ``timeout_s`` seconds.

    poll(2) reports POLLHUP/POLLERR whatever the requested events; a received RST sets the
    socket error to ECONNRESET (tcp(7)), checked by the caller with ``socket_error``.
    """
    poller = select.poll()
    poller.register(sock, select.POLLPRI)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if poller.poll(20):
            return time.monotonic()
    raise AssertionError(f"connection not reset within {timeout_s} s")


def socket_error(sock: socket.socket) -> int:
    """The pending socket error (SO_ERROR, cleared by reading it)."""
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)


def read_until_closed(sock: socket.socket, *, timeout_s: float = 10) -> tuple[bytes, str]:
    """Everything until the peer closes: (bytes, "eof" | "reset")."""
    sock.settimeout(timeout_s)
    data = bytearray()
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        return bytes(data), "reset"
    return bytes(data), "eof"


def dechunk(body: bytes) -> tuple[bytes, bool]:
    """Decode a chunked body (RFC 9112 section 7.1): (payload, complete)."""
    out = bytearray()
    rest = body
    while rest:
        line, sep, rest = rest.partition(b"\r\n")
        if not sep:
            return bytes(out), False
        size = int(line.split(b";")[0], 16)
        if size == 0:
            return bytes(out), rest.startswith(b"\r\n")
        out += rest[:size]
        rest = rest[size + 2 :]
    return bytes(out), False


ECONNRESET = errno.ECONNRESET

# --------------------------------------------------------------------------- scripted upstream

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class _Handler(socketserver.BaseRequestHandler):
    """Reads one request head and answers according to its path."""

    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(5)
        head = b""
        while b"\r\n\r\n" not in head:
            data = sock.recv(65536)
            if not data:
                return
            head += data
        path = head.split(b" ", 2)[1]
        if path == b"/health":  # what proxies that run as programs poll before they serve
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
        elif path == b"/ok":
            sock.sendall(
                SSE_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
            )
        elif path == b"/die":  # two events, then the process "dies" (FIN mid-body)
            sock.sendall(SSE_HEAD + chunk(b"data: 1\n\n") + chunk(b"data: 2\n\n"))
            time.sleep(0.1)
        elif path == b"/malformed":  # a chunk size that is not hex, then silence
            sock.sendall(SSE_HEAD + chunk(b"data: 1\n\n") + b"zz\r\nnot a chunk\r\n")
            time.sleep(3)
        elif path == b"/reset":  # one event, then a RST
            sock.sendall(SSE_HEAD + chunk(b"data: 1\n\n"))
            time.sleep(0.1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        elif path == b"/nothing":  # close without any response
            pass
        elif path == b"/extra":  # a complete body, then bytes that belong to no response
            sock.sendall(SSE_HEAD + chunk(b"data: 1\n\n") + b"0\r\n\r\nHTTP/1.1 200 OK\r\n")
            time.sleep(0.1)
        elif path == b"/trailers":  # a trailer section after the last chunk
            sock.sendall(SSE_HEAD + chunk(b"data: 1\n\n") + b"0\r\nx-done: 1\r\n\r\n")


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


@contextmanager
def scripted_upstream() -> Iterator[str]:
    """A misbehaving upstream on 127.0.0.1, port 0; yields its base URL. Paths: ``/health``
    (200, empty), ``/ok``,
    ``/die`` (FIN mid-body), ``/malformed`` (bad chunk size), ``/reset`` (RST mid-body),
    ``/nothing`` (closes without a response), ``/extra`` (bytes after a complete body),
    ``/trailers`` (a trailer section)."""
    server = _Server(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.daemon = True
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from harness._egress._server import loop_factory, loop_name
    from zwcore import ProxyError

    assert loop_factory("asyncio") is None
    uvloop = pytest.importorskip("uvloop")
    assert loop_factory("auto") is uvloop.new_event_loop
    assert loop_name("auto") == "uvloop"
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed
    assert loop_factory("auto") is None and loop_name("auto") == "asyncio"
    with pytest.raises(ProxyError, match="uvloop is not installed"):
        loop_factory("uvloop")


def test_command_line_errors_name_the_option(capsys: pytest.CaptureFixture[str]) -> None:
    from harness._egress._cli import main

    for argv, expected in (
        (["--upstream", "127.0.0.1:1"], "--upstream: upstream_url must start with http://"),
        (["--upstream", "http://127.0.0.1:1", "--buffer-bytes", "0"], "--buffer-bytes: "),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert expected in err and "pydantic" not in err
