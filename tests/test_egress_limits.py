"""The egress buffer's limits, faults and lifecycle on real sockets: misbehaving upstreams,
oversized and slow request heads, body and connection limits, target handling (not an open
proxy), configuration, the command line and SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from pydantic import ValidationError

from harness._egress import EgressConfig, EgressProxy
from harness._egress._cli import build_parser, config_from_args, parse_address
from harness._sim import SimConfig, SimServer
from tests.test_egress_helpers import (
    egress_samples,
    raw_client,
    read_until_closed,
    scripted_upstream,
)
from tests.test_sim_helpers import CLIENT, wait_for

FAST = dict(step_fixed_ms=0.5, decode_ms_per_seq=0.01, prefill_ms_per_token=0.001)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(num_blocks=256, **FAST), host="127.0.0.1") as server:
        yield server


def _proxy(upstream: str, **kw: object) -> EgressProxy:
    return EgressProxy(EgressConfig(upstream_url=upstream, listen_port=0, metrics_port=0, **kw))


# --------------------------------------------------------------------------- upstream faults


@pytest.mark.parametrize("path", ["/die", "/malformed", "/reset"])
def test_upstream_failing_mid_stream_ends_the_client_cleanly(path: str) -> None:
    with scripted_upstream() as upstream, _proxy(upstream) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port)
        t0 = time.monotonic()
        sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode())
        data, how = read_until_closed(sock, timeout_s=5)
        elapsed = time.monotonic() - t0
        sock.close()
        # what arrived is relayed, then a FIN without the chunked terminator: the client
        # knows the message is incomplete and is not left hanging
        assert how == "eof" and elapsed < 2.0
        assert data.startswith(b"HTTP/1.1 200") and b"data: 1\n\n" in data
        assert not data.endswith(b"0\r\n\r\n")
        with httpx.Client(timeout=5) as client, pytest.raises(httpx.RemoteProtocolError):
            client.get(proxy.url + path).read()
        # and it keeps serving
        for _ in range(3):
            r = CLIENT.get(proxy.url + "/ok", timeout=5)
            assert r.status_code == 200 and r.text == "data: 1\n\ndata: [DONE]\n\n"
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_upstream_errors_total{stage=mid_stream}"] == 2
        assert m["zerowindow_egress_active_streams"] == 0


@pytest.mark.parametrize(
    ("path", "end"), [("/extra", b"0\r\n\r\n"), ("/trailers", b"0\r\nx-done: 1\r\n\r\n")]
)
def test_chunked_body_passes_through_to_its_end(path: str, end: bytes) -> None:
    with scripted_upstream() as upstream, _proxy(upstream) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port)
        # two requests on one connection: the first response leaves it reusable
        request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path.encode()
        sock.sendall(request + request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        data, how = read_until_closed(sock, timeout_s=5)
        sock.close()
        # the body as the upstream framed it, trailers included, and nothing after its end
        assert how == "eof" and data.count(b"HTTP/1.1 200 OK") == 2
        assert data.count(b"\r\n\r\n9\r\ndata: 1\n\n\r\n" + end) == 2 and data.endswith(end)
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_upstream_errors_total{stage=mid_stream}"] == 0


def test_upstream_without_response_or_unreachable_is_502() -> None:
    with scripted_upstream() as upstream, _proxy(upstream) as proxy:
        assert CLIENT.get(proxy.url + "/nothing", timeout=5).status_code == 502
        assert CLIENT.get(proxy.url + "/ok", timeout=5).status_code == 200
    with _proxy(upstream) as proxy:  # the scripted upstream is gone: connection refused
        assert proxy.metrics_url is not None
        assert CLIENT.get(proxy.url + "/ok", timeout=5).status_code == 502
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_upstream_errors_total{stage=connect}"] == 1


# --------------------------------------------------------------------------- request limits


def test_oversized_head_is_431_and_closed(sim: SimServer) -> None:
    with _proxy(sim.url, max_header_bytes=8192) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port)
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n")
        data, _ = read_until_closed(sock, timeout_s=5)
        sock.close()
        assert data.startswith(b"HTTP/1.1 431 ")
        # a head that never ends is cut off the same way, without reading it all
        sock = raw_client(proxy.port)
        sock.sendall(b"GET / HTTP/1.1\r\nX-Endless: ")
        sent = 0
        try:
            for _ in range(4096):  # up to 64 MiB
                sock.sendall(b"b" * 16384)
                sent += 16384
        except OSError:
            pass
        sock.close()
        assert sent < 8 * 1024 * 1024, "the proxy kept reading an endless head"
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_rejected_total{reason=header_too_large}"] == 2
        assert CLIENT.get(proxy.url + "/v1/models").status_code == 200


def test_slow_head_is_dropped_after_the_header_timeout(sim: SimServer) -> None:
    with _proxy(sim.url, header_timeout_s=1.0) as proxy:
        assert proxy.metrics_url is not None
        trickle = raw_client(proxy.port)
        silent = raw_client(proxy.port)
        t0 = time.monotonic()
        trickle.sendall(b"GET /v1/models HTTP/1.1\r\n")
        closed_at: float | None = None
        trickle.settimeout(0.2)
        for i in range(50):  # one header line every 0.2 s, never the blank line
            try:
                trickle.sendall(b"X-Slow-%d: 1\r\n" % i)
                if trickle.recv(65536) == b"":
                    closed_at = time.monotonic()
                    break
            except TimeoutError:
                continue
            except OSError:  # reset: our late header bytes were unread when it closed
                closed_at = time.monotonic()
                break
        assert closed_at is not None and 0.9 <= closed_at - t0 <= 2.5, closed_at
        data, _ = read_until_closed(silent, timeout_s=3)
        assert data.startswith(b"HTTP/1.1 408 ")
        assert time.monotonic() - t0 <= 2.5
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_rejected_total{reason=header_timeout}"] == 2
        assert m["zerowindow_egress_connections"] == 0


def test_body_over_the_limit_is_413(sim: SimServer) -> None:
    with _proxy(sim.url, max_body_bytes=1000) as proxy:
        r = CLIENT.post(proxy.url + "/v1/completions", content=b"x" * 5000, timeout=5)
        assert r.status_code == 413
        # chunked, no Content-Length: counted as it arrives
        r = CLIENT.post(proxy.url + "/v1/completions", content=iter([b"x" * 600] * 3), timeout=5)
        assert r.status_code == 413
        r = CLIENT.post(
            proxy.url + "/v1/completions", json={"prompt": "ok", "max_tokens": 2}, timeout=5
        )
        assert r.status_code == 200 and r.json()["object"] == "text_completion"


def test_connection_limit_is_503(sim: SimServer) -> None:
    with _proxy(sim.url, max_connections=2) as proxy, httpx.Client(timeout=5) as other:
        assert proxy.metrics_url is not None
        held = [raw_client(proxy.port), raw_client(proxy.port)]
        wait_for(
            lambda: proxy.registry.get_sample_value("zerowindow_egress_connections") == 2,
            timeout_s=2,
            what="two connections",
        )
        r = other.get(proxy.url + "/v1/models")
        assert r.status_code == 503
        for sock in held:
            sock.close()
        wait_for(
            lambda: proxy.registry.get_sample_value("zerowindow_egress_connections") == 0,
            timeout_s=2,
            what="connections closed",
        )
        assert other.get(proxy.url + "/v1/models").status_code == 200
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_rejected_total{reason=too_many_connections}"] == 1


def test_forwards_only_to_its_upstream(sim: SimServer) -> None:
    with _proxy(sim.url) as proxy:
        # absolute-form: the authority is ignored (RFC 9112 section 3.2.2), the sim answers
        sock = raw_client(proxy.port)
        sock.sendall(
            b"GET http://example.invalid:9/v1/models HTTP/1.1\r\nHost: example.invalid\r\n"
            b"Connection: close\r\n\r\n"
        )
        data, _ = read_until_closed(sock)
        sock.close()
        assert data.startswith(b"HTTP/1.1 200") and b'"owned_by":"vllm"' in data
        sock = raw_client(proxy.port)
        sock.sendall(b"CONNECT example.invalid:443 HTTP/1.1\r\nHost: example.invalid:443\r\n\r\n")
        data, _ = read_until_closed(sock)
        sock.close()
        assert data.startswith(b"HTTP/1.1 405 ")


def test_keep_alive_and_pipelining(sim: SimServer) -> None:
    with _proxy(sim.url) as proxy:
        sock = raw_client(proxy.port)
        request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.sendall(request * 2 + b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data, how = read_until_closed(sock)
        assert how == "eof"
        assert data.count(b"HTTP/1.1 200 OK") == 3
        assert data.count(b'"object":"list"') == 2


# --------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "url",
    ["https://x:1", "http://", "http://x:1/v1", "http://u:p@x:1", "http://x:99999", "x:1"],
)
def test_config_rejects_upstreams_that_are_not_plain_http(url: str) -> None:
    with pytest.raises(ValidationError):
        EgressConfig(upstream_url=url)


def test_config_and_command_line() -> None:
    cfg = EgressConfig(upstream_url="http://[::1]:8000")
    assert (cfg.upstream_host, cfg.upstream_port, cfg.upstream_authority) == (
        "::1", 8000, "[::1]:8000",
    )  # fmt: skip
    assert EgressConfig(upstream_url="http://h").upstream_authority == "h"
    assert cfg.buffer_bytes == 256 * 1024 and cfg.overflow == "cut" and cfg.stall_timeout_s == 2.5
    with pytest.raises(ValidationError):
        EgressConfig(upstream_url="http://h:1", overflow="drop")
    with pytest.raises(ValidationError):
        EgressConfig(upstream_url="http://h:1", unknown=1)  # type: ignore[call-arg]
    assert parse_address("0.0.0.0:80") == ("0.0.0.0", 80)
    assert parse_address("[::1]:8080") == ("::1", 8080)
    assert parse_address("9000") == ("127.0.0.1", 9000)
    for bad in ("host", "::1:80", "h:port", "h:70000"):
        with pytest.raises(ValueError):
            parse_address(bad)
    args = build_parser().parse_args(
        ["--upstream", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--metrics-listen",
         "127.0.0.1:9100", "--overflow", "pause", "--stall-timeout-s", "2",
         "--client-sndbuf-bytes", "4096"]
    )  # fmt: skip
    cfg = config_from_args(args)
    assert cfg.listen_port == 0 and cfg.metrics_port == 9100 and cfg.overflow == "pause"
    assert cfg.stall_timeout_s == 2.0 and cfg.client_sndbuf_bytes == 4096
    args = build_parser().parse_args(["--upstream", "http://h:1", "--client-sndbuf-bytes", "none"])
    assert config_from_args(args).client_sndbuf_bytes is None


def test_command_line_serves_and_stops_gracefully_on_sigterm() -> None:
    # 600 tokens at ~5 ms a step: a stream of about 3 s, in progress when SIGTERM comes
    with SimServer(SimConfig(step_fixed_ms=5.0), host="127.0.0.1") as sim:
        _serve_and_sigterm(sim)


def _serve_and_sigterm(sim: SimServer) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness._egress", "--upstream", sim.url, "--listen",
         "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"],
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"listening on (http://\S+), upstream \S+, metrics (http://\S+)", line)
        assert found, line
        url, metrics_url = found.group(1), found.group(2)
        assert CLIENT.get(url + "/v1/models").status_code == 200
        # a stream in progress when SIGTERM arrives is finished, then the process exits 0
        body = {"model": "sim", "prompt": "term", "max_tokens": 600, "ignore_eos": True,
                "stream": True}  # fmt: skip
        result: dict[str, bytes] = {}

        def stream() -> None:
            with httpx.Client(timeout=10) as client:
                with client.stream("POST", url + "/v1/completions", json=body) as r:
                    result["body"] = r.read()

        reader = threading.Thread(target=stream)
        reader.start()
        wait_for(
            lambda: egress_samples(metrics_url)["zerowindow_egress_active_streams"] == 1,
            timeout_s=5,
            what="the stream to start",
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        reader.join(5)
        assert result["body"].endswith(b"data: [DONE]\n\n")
        with pytest.raises(httpx.ConnectError):
            CLIENT.get(url + "/v1/models")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
