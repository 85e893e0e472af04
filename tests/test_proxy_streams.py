"""Real SSE streams from the engine emulator through each proxy kind, on real sockets.

Fast readers get the same token text as a direct read; a reader that stops is cut by the
proxies configured to cut it (buffered nginx with ``send_timeout 3s``, HAProxy's ``timeout
client``, Envoy's stream idle timeout) and the engine aborts its request, while nginx with
the common SSE advice (buffering off) leaves it alone until its own ``send_timeout``; slow
readers that keep making progress are never cut; an upstream that dies or sends malformed
chunks ends the client's response cleanly and the proxy keeps serving; slow and oversized
request heads are refused without unbounded memory growth. The egress buffer's own versions
of these are in test_egress_stream.py and test_egress_limits.py; it joins the byte-identity
test here.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness._sim import SimConfig, SimServer
from tests.test_egress_helpers import (
    ECONNRESET,
    completion_request,
    dechunk,
    mask_volatile,
    raw_client,
    read_head,
    read_until_closed,
    scripted_upstream,
    socket_error,
    wait_reset,
)
from tests.test_proxy_helpers import (
    group_rss_bytes,
    param,
    proxy_config,
    running_proxy,
    token_text,
)
from tests.test_sim_helpers import CLIENT, scrape, wait_for

STEP_MS = 6.0
"""Slow sim: one token per ~6 ms step, so 1,900 tokens take over 11 s."""
LONG_TOKENS = 1900
FAST = dict(step_fixed_ms=0.5, decode_ms_per_seq=0.01, prefill_ms_per_token=0.001)
THIRD_PARTY = [param("nginx-buffered"), param("nginx-sse"), param("haproxy"), param("envoy")]


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(num_blocks=256, seed=3, **FAST), host="127.0.0.1") as sim:
        yield sim


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(step_fixed_ms=STEP_MS, seed=7), host="127.0.0.1") as sim:
        yield sim


def _idle(sim: SimServer) -> dict[str, float]:
    wait_for(
        lambda: scrape(sim.url)["vllm:num_requests_running"] == 0, timeout_s=15, what="idle sim"
    )
    return scrape(sim.url)


BODY: dict[str, object] = {
    "model": "sim", "prompt": "same prompt, same tokens", "max_tokens": 400, "ignore_eos": True,
    "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True},
}  # fmt: skip


def _stream(url: str) -> bytes:
    with CLIENT.stream("POST", url + "/v1/completions", json=BODY, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.read()


@pytest.mark.parametrize("name", [param("none"), *THIRD_PARTY, param("egress")])
def test_fast_reader_gets_the_same_token_text_as_a_direct_read(
    fast_sim: SimServer, tmp_path: Path, name: str
) -> None:
    direct = _stream(fast_sim.url)
    with running_proxy(proxy_config(name), tmp_path, fast_sim.url) as (url, _):
        proxied = _stream(url)
    assert direct.endswith(b"data: [DONE]\n\n") and len(direct) > 50_000
    text = token_text(direct)
    assert len(text) > 400 and token_text(proxied) == text
    # byte-identical but for each response's random id and creation time
    assert mask_volatile(proxied) == mask_volatile(direct)


# --------------------------------------------------------------------------- stalled readers


def _stall(port: int, max_tokens: int) -> tuple[socket.socket, float]:
    """Send a long streaming request with a 4 KiB receive buffer, read the head, then stop
    reading; returns the socket and the time the head arrived."""
    sock = raw_client(port, rcvbuf=4096)
    sock.sendall(completion_request(max_tokens=max_tokens))
    assert read_head(sock).startswith(b"HTTP/1.1 200")
    return sock, time.monotonic()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


SNDBUF = {"client_sndbuf_bytes": 32768}
"""A fixed 32 KiB kernel send buffer toward clients: with the kernel's autotuning, Send-Q on
loopback grows to ~4 MB (measured: tb3939840 in ``ss -m``) before a write to a stalled
reader blocks, and no write-stall timer of any proxy starts before that."""
CUT_TOKENS = 3000
"""18 s of generation on the slow sim: the cut must come long before that."""

CUTTERS = [
    param("nginx-buffered", {**SNDBUF, "max_temp_file_size_mb": 0}, True),
    param("haproxy", {**SNDBUF, "timeout_client_s": 3.0, "nolinger": True}, True),
    param("envoy", {**SNDBUF, "stream_idle_timeout_s": 3.0, "buffer_limit_bytes": 32768}, False),
]


@pytest.mark.parametrize(("name", "options", "rst"), CUTTERS)
def test_stopped_reader_is_cut_and_the_engine_aborts(
    slow_sim: SimServer, tmp_path: Path, name: str, options: dict[str, object], rst: bool
) -> None:
    """Each proxy's 3 s write-stall cut with bounded buffers (nginx buffering in memory only,
    HAProxy's two 16 KiB buffers, Envoy's 32 KiB connection buffer): once the proxy's buffers
    and the upstream socket are full (a few seconds at the sim's ~40 KB/s), nothing moves for
    3 s, the proxy cuts the client and closes the upstream, and the engine aborts long before
    max_tokens. nginx (``reset_timedout_connection``) and HAProxy (``option nolinger``) reset
    the client (HAProxy closes the server side at the timeout and resets the client one
    ``timeout client`` later: measured 5.85 s and 8.86 s after the head); Envoy closes it
    behind the unsent data, so the client sees the rest and an EOF without the chunked
    terminator once it reads again."""
    before = _idle(slow_sim)
    config = proxy_config(name, **options)
    with running_proxy(config, tmp_path, slow_sim.url) as (url, _):
        sock, t_head = _stall(_port(url), CUT_TOKENS)
        wait_for(
            lambda: scrape(slow_sim.url)["vllm:num_requests_running"] == 0,
            timeout_s=CUT_TOKENS * STEP_MS / 1e3,
            interval_s=0.1,
            what="the engine to drop the request",
        )
        t_abort = time.monotonic()
        if rst:  # a RST, not a FIN: nginx's at once, HAProxy's one more timeout later
            wait_reset(sock, timeout_s=3.0 + 2.0)
            assert socket_error(sock) == ECONNRESET
        else:
            data, how = read_until_closed(sock, timeout_s=5)
            assert how == "eof" and not data.endswith(b"0\r\n\r\n"), data[-100:]
        sock.close()
        assert t_abort - t_head >= 3.0
    after = scrape(slow_sim.url)
    assert (
        after["vllm:request_success_total:abort"] == before["vllm:request_success_total:abort"] + 1
    )
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < CUT_TOKENS * 0.7, generated


@pytest.mark.parametrize("name", [param("nginx-buffered")])
def test_buffered_nginx_with_its_temp_file_cuts_only_after_the_engine_finished(
    slow_sim: SimServer, tmp_path: Path, name: str
) -> None:
    """The ``buffered-reset`` preset as it is (``proxy_max_temp_file_size`` 1024m): nginx
    reads the whole response into memory and its temporary file, and every upstream read
    re-arms the client's ``send_timeout`` (ngx_event_pipe adds the write timer again), so the
    stalled reader is reset 3 s after the engine finished, not 3 s after the stall began: the
    engine decodes every token for nobody."""
    before = _idle(slow_sim)
    tokens = 800
    with running_proxy(proxy_config(name, **SNDBUF), tmp_path, slow_sim.url) as (url, _):
        sock, t_head = _stall(_port(url), tokens)
        wait_for(
            lambda: scrape(slow_sim.url)["vllm:num_requests_running"] == 0,
            timeout_s=30,
            interval_s=0.1,
            what="the engine to finish",
        )
        t_done = time.monotonic()
        t_cut = wait_reset(sock, timeout_s=10)
        assert socket_error(sock) == ECONNRESET
        sock.close()
        assert t_done - t_head > 3.5  # the stall outlasted send_timeout while the engine ran
        assert 2.5 <= t_cut - t_done <= 3.0 + 2.0, t_cut - t_done
    after = scrape(slow_sim.url)
    assert after["vllm:request_success_total:abort"] == before["vllm:request_success_total:abort"]
    assert after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"] == tokens


@pytest.mark.parametrize("name", [param("nginx-sse")])
def test_unbuffered_nginx_leaves_a_stalled_reader_to_its_own_send_timeout(
    slow_sim: SimServer, tmp_path: Path, name: str
) -> None:
    """The common SSE advice (buffering off) with ``send_timeout 3s``: nginx stops reading
    the engine's stream when its one buffer is full, but each byte the upstream socket still
    takes re-arms the client's timer, so the cut waits until the kernel buffers between nginx
    and the engine are full too. 5.5 s into the stall (when the memory-buffered nginx above
    has long cut it) the engine still decodes for the stalled reader; nginx's own timeout
    ends it later."""
    before = _idle(slow_sim)
    config = proxy_config(name, **SNDBUF, send_timeout_s=3.0)
    with running_proxy(config, tmp_path, slow_sim.url) as (url, _):
        sock, t_head = _stall(_port(url), CUT_TOKENS)
        time.sleep(max(0.0, t_head + 5.5 - time.monotonic()))
        assert scrape(slow_sim.url)["vllm:num_requests_running"] == 1
        wait_for(
            lambda: scrape(slow_sim.url)["vllm:num_requests_running"] == 0,
            timeout_s=CUT_TOKENS * STEP_MS / 1e3,
            interval_s=0.1,
            what="nginx's send_timeout to end the request",
        )
        sock.close()
    after = scrape(slow_sim.url)
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated > 5.5 / (STEP_MS / 1e3) * 0.5, generated


@pytest.mark.parametrize(
    ("name", "options"),
    [
        param("nginx-buffered", {}),
        param("haproxy", {"timeout_client_s": 3.0, "nolinger": True}),
        param("envoy", {"stream_idle_timeout_s": 3.0, "buffer_limit_bytes": 32768}),
    ],
)
def test_slow_reader_making_progress_is_not_cut(
    slow_sim: SimServer, tmp_path: Path, name: str, options: dict[str, object]
) -> None:
    """About 85 KB of SSE produced in ~2 s, read at 20 KB/s (4 KiB every 0.2 s for ~4 s):
    longer than the 3 s stall cut, but every read makes progress."""
    before = _idle(slow_sim)
    with running_proxy(proxy_config(name, **options), tmp_path, slow_sim.url) as (url, _):
        sock = raw_client(_port(url), rcvbuf=4096)
        sock.sendall(completion_request(max_tokens=300))
        head = read_head(sock)
        assert b"chunked" in head.lower()
        body = bytearray()
        sock.settimeout(5)
        t0 = time.monotonic()
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(4096)
            assert chunk, "closed before the end of the stream"
            body += chunk
            time.sleep(0.2)
        sock.close()
        assert time.monotonic() - t0 > 3.0  # the reader was slower than the cut
        payload, complete = dechunk(bytes(body))
        assert complete and payload.endswith(b"data: [DONE]\n\n")
    after = scrape(slow_sim.url)
    assert after["vllm:request_success_total:abort"] == before["vllm:request_success_total:abort"]


# --------------------------------------------------------------------------- upstream faults


@pytest.mark.parametrize("name", THIRD_PARTY)
def test_upstream_failing_mid_stream_ends_the_client_cleanly(tmp_path: Path, name: str) -> None:
    with (
        scripted_upstream() as upstream,
        running_proxy(proxy_config(name), tmp_path, upstream) as (url, proxy),
    ):
        port = _port(url)
        outcomes: dict[str, str] = {}
        for path in (b"/die", b"/malformed", b"/reset"):
            sock = raw_client(port)
            t0 = time.monotonic()
            sock.sendall(b"GET %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n" % path)
            data, how = read_until_closed(sock, timeout_s=10)
            elapsed = time.monotonic() - t0
            sock.close()
            outcomes[path.decode()] = data.split(b"\r\n", 1)[0].decode() or "closed, no response"
            # the client is not left hanging, and what it got is visibly incomplete or an
            # error: a 200 without the chunked terminator, a 5xx, or no response at all
            assert elapsed < 4.0, (path, elapsed)
            if data.startswith(b"HTTP/1.1 200"):
                assert not data.endswith(b"0\r\n\r\n"), (path, how, data)
            else:
                assert data == b"" or data[9:10] == b"5", (path, data[:200])
            if path == b"/die":  # complete events before the upstream died are relayed
                assert data.startswith(b"HTTP/1.1 200") and b"data: 1\n\n" in data, data
            # and it keeps serving
            r = CLIENT.get(url + "/ok", timeout=5)
            assert r.status_code == 200 and r.text == "data: 1\n\ndata: [DONE]\n\n"
        assert proxy.failure() is None


# --------------------------------------------------------------------------- request heads


HEAD_LIMITS = [
    param("nginx-buffered", {"client_header_timeout_s": 1.0}),
    param("haproxy", {"timeout_http_request_s": 1.0}),
    param("envoy", {"request_headers_timeout_s": 1.0, "max_request_headers_kb": 16}),
]


@pytest.mark.parametrize(("name", "options"), HEAD_LIMITS)
def test_oversized_and_endless_heads_are_refused_with_bounded_memory(
    fast_sim: SimServer, tmp_path: Path, name: str, options: dict[str, object]
) -> None:
    with running_proxy(proxy_config(name, **options), tmp_path, fast_sim.url) as (url, proxy):
        port = int(url.rsplit(":", 1)[1])
        rss_before = group_rss_bytes(proxy)
        sock = raw_client(port)
        try:
            sock.sendall(
                b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 65536 + b"\r\n\r\n"
            )
        except OSError:
            pass  # refused before it read it all
        data, _ = read_until_closed(sock, timeout_s=5)
        sock.close()
        assert data[9:12] in (b"400", b"431", b"494"), data[:200]
        # ten heads that never end, 4 MiB each
        socks = [raw_client(port) for _ in range(10)]
        sent = 0
        for s in socks:
            try:
                s.sendall(b"GET / HTTP/1.1\r\nX-Endless: ")
                for _ in range(256):
                    s.sendall(b"b" * 16384)
                    sent += 16384
            except OSError:
                pass
        grown = group_rss_bytes(proxy) - rss_before
        for s in socks:
            s.close()
        assert grown < 16 * 1024 * 1024, f"{name} grew by {grown} bytes after {sent} sent"
        assert CLIENT.get(url + "/v1/models", timeout=5).status_code == 200


@pytest.mark.parametrize(("name", "options"), HEAD_LIMITS)
def test_slow_head_is_dropped_after_the_header_timeout(
    fast_sim: SimServer, tmp_path: Path, name: str, options: dict[str, object]
) -> None:
    with running_proxy(proxy_config(name, **options), tmp_path, fast_sim.url) as (url, _):
        trickle = raw_client(int(url.rsplit(":", 1)[1]))
        t0 = time.monotonic()
        trickle.sendall(b"GET /v1/models HTTP/1.1\r\n")
        closed_at: float | None = None
        trickle.settimeout(0.2)
        for i in range(50):  # one header line every 0.2 s, never the blank line
            try:
                trickle.sendall(b"X-Slow-%d: 1\r\n" % i)
                if not trickle.recv(65536):
                    closed_at = time.monotonic()
                    break
            except TimeoutError:
                continue
            except OSError:  # reset
                closed_at = time.monotonic()
                break
        trickle.close()
        assert closed_at is not None, "the slow head was never dropped"
        assert 0.8 <= closed_at - t0 <= 3.0, closed_at - t0
        assert CLIENT.get(url + "/v1/models", timeout=5).status_code == 200
