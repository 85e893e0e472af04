"""The egress buffer relaying real SSE streams from the engine emulator, on real sockets.

Readers: full speed (byte-identical to a direct read), stopped (reset after the stall
timeout, the engine aborts the request), slow but progressing (never cut), and the two
overflow policies. The sim is deterministic from its seed except for each response's random
id and ``created`` time, which the comparisons mask.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness._egress import EgressConfig, EgressProxy
from harness._sim import SimConfig, SimServer
from tests.test_egress_helpers import (
    ECONNRESET,
    completion_request,
    dechunk,
    egress_samples,
    mask_volatile,
    raw_client,
    read_head,
    socket_error,
    wait_reset,
)
from tests.test_sim_helpers import CLIENT, scrape, wait_for

STEP_MS = 6.0
"""Slow sim: one token per ~6 ms step, so 1,900 tokens take over 11 s (measured: ~165/s)."""
LONG_TOKENS = 1900
FAST = dict(step_fixed_ms=0.5, decode_ms_per_seq=0.01, prefill_ms_per_token=0.001)


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(step_fixed_ms=STEP_MS, seed=7), host="127.0.0.1") as sim:
        yield sim


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(num_blocks=256, seed=3, **FAST), host="127.0.0.1") as sim:
        yield sim


def _proxy(upstream: str, **kw: object) -> EgressProxy:
    return EgressProxy(EgressConfig(upstream_url=upstream, listen_port=0, metrics_port=0, **kw))


def _idle(sim: SimServer) -> dict[str, float]:
    wait_for(
        lambda: scrape(sim.url)["vllm:num_requests_running"] == 0, timeout_s=10, what="idle sim"
    )
    return scrape(sim.url)


def _stream(url: str, path: str, body: dict[str, object]) -> bytes:
    with CLIENT.stream("POST", url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return r.read()


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_fast_reader_gets_identical_bytes(fast_sim: SimServer, path: str) -> None:
    body: dict[str, object] = {
        "model": "sim", "max_tokens": 300, "ignore_eos": True, "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }  # fmt: skip
    if path == "/v1/completions":
        body["prompt"] = "same prompt, same tokens"
    else:
        body["messages"] = [{"role": "user", "content": "same prompt, same tokens"}]
    direct = _stream(fast_sim.url, path, body)
    with _proxy(fast_sim.url) as proxy:
        proxied = _stream(proxy.url, path, body)
        # every path goes upstream, the engine's /metrics included
        assert "vllm:num_requests_running" in CLIENT.get(proxy.url + "/metrics").text
    assert direct.endswith(b"data: [DONE]\n\n") and len(direct) > 50_000
    assert mask_volatile(proxied) == mask_volatile(direct)


@pytest.mark.parametrize("sndbuf", [4096, 1 << 20], ids=["sndbuf-4k", "sndbuf-1m"])
def test_stalled_reader_is_reset_and_request_aborted(
    slow_sim: SimServer, sndbuf: int, tmp_path: Path
) -> None:
    """A stall is no delivery progress: the reader is cut after the timeout whether its send
    buffer holds 4 KiB or 1 MiB (an unwritable-socket timer never fires behind 1 MiB), and its
    connection's record says so."""
    before = _idle(slow_sim)
    log = tmp_path / "clients.jsonl"
    with _proxy(
        slow_sim.url, stall_timeout_s=2.0, client_sndbuf_bytes=sndbuf, clients_log=str(log)
    ) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port, rcvbuf=4096)
        t0 = time.monotonic()
        sock.sendall(completion_request(max_tokens=LONG_TOKENS))
        assert read_head(sock).startswith(b"HTTP/1.1 200")
        t_head = time.monotonic()
        # stop reading: the pipe (client Recv-Q, proxy Send-Q) fills within ~0.5 s at the
        # sim's ~40 KB/s, then the proxy's buffer grows and no byte is accepted any more
        t_reset = wait_reset(sock, timeout_s=8)
        assert socket_error(sock) == ECONNRESET  # a RST, not a FIN
        sock.close()
        assert 2.0 <= t_reset - t_head <= 2.0 + 1.5, t_reset - t_head

        # the engine aborted the request long before max_tokens could have been generated
        wait_for(
            lambda: scrape(slow_sim.url)["vllm:num_requests_running"] == 0,
            timeout_s=1.0,
            what="the sim to drop the request",
        )
        t_abort = time.monotonic()
        after = scrape(slow_sim.url)
        assert after["vllm:request_success_total:abort"] == (
            before["vllm:request_success_total:abort"] + 1
        )
        generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        assert generated < LONG_TOKENS / 2
        assert t_abort - t0 < LONG_TOKENS * STEP_MS / 1e3 / 2

        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_cuts_total{reason=stall_timeout}"] == 1
        assert m["zerowindow_egress_cuts_total{reason=overflow}"] == 0
        assert m["zerowindow_egress_upstream_aborts_total{reason=stall_timeout}"] == 1
        assert m["zerowindow_egress_stalls_total"] >= 1
        assert m["zerowindow_egress_stall_duration_seconds_count"] >= 1
        # the cut stall lasted the timeout, to within a watchdog tick or two
        assert m["zerowindow_egress_stall_duration_seconds_bucket{le=2.5}"] >= 1
        assert (
            m["zerowindow_egress_stall_duration_seconds_bucket{le=1.5}"]
            < (m["zerowindow_egress_stall_duration_seconds_count"])
        )
        assert m["zerowindow_egress_active_streams"] == 0
        assert m["zerowindow_egress_requests_total"] == 1
    [record] = [json.loads(line) for line in log.read_text().splitlines()]
    assert record["cut_reason"] == "stall_timeout"
    assert 2.0 <= record["t_cut"] - record["t_last_progress"] <= 2.0 + 0.5, record
    assert 0 < record["bytes_acked"] < record["bytes_written"]
    acked = [b for _, b in record["acked"]]
    assert acked == sorted(acked) and 0 < acked[-1] <= record["bytes_acked"]


@pytest.mark.parametrize("sndbuf", [4096, None], ids=["sndbuf-4k", "sndbuf-default"])
def test_slow_reader_making_progress_is_not_cut(slow_sim: SimServer, sndbuf: int | None) -> None:
    kw: dict[str, object] = {} if sndbuf is None else {"client_sndbuf_bytes": sndbuf}
    before = _idle(slow_sim)
    with _proxy(slow_sim.url, stall_timeout_s=2.0, **kw) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port, rcvbuf=4096)
        # ~85 KB of SSE produced in ~2 s, read at 20 KB/s: 4 KiB every 0.2 s for ~4 s
        sock.sendall(completion_request(max_tokens=300))
        head = read_head(sock)
        body = bytearray()
        sock.settimeout(5)
        while not body.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(4096)
            assert chunk, "closed before the end of the stream"
            body += chunk
            time.sleep(0.2)
        sock.close()
        payload, complete = dechunk(bytes(body))
        assert head.startswith(b"HTTP/1.1 200") and complete
        assert payload.endswith(b"data: [DONE]\n\n")
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_cuts_total{reason=stall_timeout}"] == 0
        assert m["zerowindow_egress_upstream_aborts_total{reason=stall_timeout}"] == 0
        if sndbuf is not None:  # with the default 32 KiB the kernel holds it all
            # it did have to buffer: the reader was slower than the engine
            assert m["zerowindow_egress_stream_peak_buffered_bytes_sum"] > 4096
    after = scrape(slow_sim.url)
    assert after["vllm:request_success_total:abort"] == before["vllm:request_success_total:abort"]


def test_overflow_cut_resets_before_the_stall_timeout(slow_sim: SimServer) -> None:
    before = _idle(slow_sim)
    with _proxy(
        slow_sim.url,
        buffer_bytes=16384,
        overflow="cut",
        stall_timeout_s=30,
        client_sndbuf_bytes=4096,
    ) as proxy:
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port, rcvbuf=4096)
        sock.sendall(completion_request(max_tokens=LONG_TOKENS))
        read_head(sock)
        t_head = time.monotonic()
        t_reset = wait_reset(sock, timeout_s=5)
        assert socket_error(sock) == ECONNRESET
        sock.close()
        assert t_reset - t_head < 3.0  # 16 KiB at ~40 KB/s, plus the kernel buffers
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_cuts_total{reason=overflow}"] == 1
        assert m["zerowindow_egress_upstream_aborts_total{reason=overflow}"] == 1
        assert m["zerowindow_egress_cuts_total{reason=stall_timeout}"] == 0
    wait_for(
        lambda: (
            scrape(slow_sim.url)["vllm:request_success_total:abort"]
            == before["vllm:request_success_total:abort"] + 1
        ),
        timeout_s=2,
        what="the abort",
    )


def test_overflow_pause_stops_reading_upstream_and_loses_nothing(fast_sim: SimServer) -> None:
    body: dict[str, object] = {
        "model": "sim", "prompt": "pause", "max_tokens": 400, "ignore_eos": True, "stream": True,
    }  # fmt: skip
    direct = _stream(fast_sim.url, "/v1/completions", body)
    with _proxy(
        fast_sim.url, buffer_bytes=16384, overflow="pause", stall_timeout_s=5,
        client_sndbuf_bytes=4096,
    ) as proxy:  # fmt: skip
        assert proxy.metrics_url is not None
        sock = raw_client(proxy.port, rcvbuf=4096)
        sock.sendall(completion_request(max_tokens=400, prompt="pause"))
        read_head(sock)
        time.sleep(1.5)  # the sim is done generating by now; the proxy holds <= 16 KiB
        m = egress_samples(proxy.metrics_url)
        assert 0 < m["zerowindow_egress_buffered_bytes"] <= 16384 + 1024
        received = bytearray()
        sock.settimeout(10)
        while not received.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk
            received += chunk
        sock.close()
        payload, complete = dechunk(bytes(received))
        assert complete
        assert mask_volatile(payload) == mask_volatile(direct)
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_cuts_total{reason=overflow}"] == 0
        assert m["zerowindow_egress_stream_peak_buffered_bytes_bucket{le=65536.0}"] == 1


def test_client_going_away_aborts_the_request(slow_sim: SimServer) -> None:
    before = _idle(slow_sim)
    with _proxy(slow_sim.url) as proxy, httpx.Client(timeout=10) as client:
        assert proxy.metrics_url is not None
        body = {"model": "sim", "prompt": "bye", "max_tokens": LONG_TOKENS, "ignore_eos": True,
                "stream": True}  # fmt: skip
        with client.stream("POST", proxy.url + "/v1/completions", json=body) as r:
            for _ in r.iter_raw():
                break  # close after the first bytes
        wait_for(
            lambda: scrape(slow_sim.url)["vllm:num_requests_running"] == 0,
            timeout_s=2,
            what="the abort",
        )
        after = scrape(slow_sim.url)
        assert (
            after["vllm:request_success_total:abort"]
            == before["vllm:request_success_total:abort"] + 1
        )
        m = egress_samples(proxy.metrics_url)
        assert m["zerowindow_egress_upstream_aborts_total{reason=client_closed}"] == 1
        assert m["zerowindow_egress_cuts_total{reason=stall_timeout}"] == 0
