"""KV coupled to socket delivery (``on_delivery``) or not (``on_finish``), on real sockets.

Stalled clients (SO_RCVBUF=4096 set before connect, never reading) stream 2000 tokens each,
far more than the socket buffers hold, so their responses cannot be delivered while they
stay open. With ``on_delivery`` their KV must stay allocated after generation has ended,
and be freed when they close; with ``on_finish`` it must be freed when generation ends.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness._sim import SimConfig, SimServer
from tests.test_sim_helpers import (
    CLIENT,
    fast_sim_config,
    generation_over,
    scrape,
    stalled_client,
    wait_for,
)

MAX_TOKENS = 2000
CLIENTS = 4


def _config(kv_release: str, **kw: object) -> SimConfig:
    return fast_sim_config(kv_release, **{"max_num_seqs": 16, **kw})


@pytest.mark.parametrize("sndbuf_bytes", [None, 16384], ids=["autotuned-sndbuf", "16KiB-sndbuf"])
def test_on_delivery_holds_kv_until_stalled_clients_close(sndbuf_bytes: int | None) -> None:
    with SimServer(_config("on_delivery", sndbuf_bytes=sndbuf_bytes)) as srv:
        clients = [stalled_client(srv.port, max_tokens=MAX_TOKENS) for _ in range(CLIENTS)]
        try:
            wait_for(
                lambda: generation_over(srv.url, CLIENTS * MAX_TOKENS),
                timeout_s=30,
                what="generation to end",
            )
            # Generation is over, the clients are open and unread: KV stays allocated.
            for _ in range(6):
                m = scrape(srv.url)
                assert m["vllm:kv_cache_usage_perc"] > 0.9  # 4 x 63 blocks of 256
                assert m["sim:num_requests_held_for_delivery"] == CLIENTS
                assert m["vllm:num_requests_running"] == 0
                time.sleep(0.25)
            assert m["vllm:request_success_total:length"] == CLIENTS
            if sndbuf_bytes is not None:
                # With a small send buffer the streams are stuck in the ASGI send itself:
                # tokens pile up in their output collectors, not taken by the HTTP layer.
                streams = srv.app.engine.streams.values()
                assert len(streams) == CLIENTS
                assert all(s.num_pending > 0 for s in streams)
        finally:
            for c in clients:
                c.close()
        wait_for(
            lambda: scrape(srv.url)["vllm:kv_cache_usage_perc"] == 0,
            timeout_s=10,
            what="KV to be freed after the clients closed",
        )
        m = scrape(srv.url)
        assert m["sim:num_requests_held_for_delivery"] == 0
        assert m["vllm:request_success_total:abort"] == 0  # they had finished generating


def test_on_finish_frees_kv_while_stalled_clients_stay_open() -> None:
    with SimServer(_config("on_finish")) as srv:
        clients = [stalled_client(srv.port, max_tokens=MAX_TOKENS) for _ in range(CLIENTS)]
        try:
            wait_for(
                lambda: generation_over(srv.url, CLIENTS * MAX_TOKENS),
                timeout_s=30,
                what="generation to end",
            )
            wait_for(
                lambda: scrape(srv.url)["vllm:kv_cache_usage_perc"] == 0,
                timeout_s=5,
                what="KV to be freed at the end of generation",
            )
            assert all(c.fileno() >= 0 for c in clients)  # still open, still unread
            assert scrape(srv.url)["sim:num_requests_held_for_delivery"] == 0
        finally:
            for c in clients:
                c.close()


def _stream_ttft(url: str, prompt: str, max_tokens: int) -> tuple[float, int]:
    """(seconds to the first token event, completion tokens) of one fast reader."""
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.monotonic()
    ttft = None
    tokens = 0
    with CLIENT.stream("POST", url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if ttft is None and line.startswith("data: {"):
                ttft = time.monotonic() - start
            if '"choices":[]' in line:
                tokens = int(line.split('"completion_tokens":')[1].rstrip("}"))
    assert ttft is not None
    return ttft, tokens


def _distinct(i: int, word: str, words: int) -> str:
    """A prompt of ``words`` words that shares no block with another index's: the prefix cache
    (on by default, as in vLLM) would otherwise share their KV blocks."""
    return " ".join([f"p{i}"] + [word] * (words - 1))


def _fast_readers(url: str, n: int, *, prompt_words: int, max_tokens: int) -> list[float]:
    with ThreadPoolExecutor(n) as pool:
        results = list(pool.map(
            lambda i: _stream_ttft(url, _distinct(i, "word", prompt_words), max_tokens), range(n)
        ))  # fmt: skip
    assert all(tokens == max_tokens for _, tokens in results)
    return [ttft for ttft, _ in results]


def _hostage_run(kv_release: str, stalled: int) -> tuple[float, float]:
    """Fast readers after ``stalled`` stalled clients finished generating: (max TTFT s,
    preemptions during the fast readers)."""
    cfg = _config(kv_release, num_blocks=128, step_fixed_ms=2.0)
    with SimServer(cfg) as srv:
        # Long prompts make the stalled requests big (1500 tokens, 47 blocks) in few steps.
        clients = [
            stalled_client(srv.port, max_tokens=100, prompt=_distinct(100 + i, "long", 1400))
            for i in range(stalled)
        ]
        try:
            wait_for(
                lambda: generation_over(srv.url, stalled * 100),
                timeout_s=30,
                what="stalled clients' generation to end",
            )
            before = scrape(srv.url)["vllm:num_preemptions_total"]
            ttfts = _fast_readers(srv.url, 6, prompt_words=200, max_tokens=100)
            after = scrape(srv.url)["vllm:num_preemptions_total"]
        finally:
            for c in clients:
                c.close()
    return max(ttfts), after - before


def _faster_of_two(kv_release: str, stalled: int, below: float) -> tuple[float, float]:
    """:func:`_hostage_run`, tried once more when its TTFT is not ``below``: a hiccup of a
    busy machine (a fresh thread pool, a collection) only ever slows a run, and the faster try
    is the engine's. (A fresh clone once measured 0.55 s for a run that takes 0.05 s.)"""
    first = _hostage_run(kv_release, stalled)
    return first if first[0] < below else min(first, _hostage_run(kv_release, stalled))


def test_hostage_effect_only_when_coupled() -> None:
    # 2 stalled clients hold 2 x 47 of 128 blocks in on_delivery; 6 fast readers need 10
    # blocks each (200-token prompts + 100 tokens): they queue and preempt each other.
    coupled_ttft, coupled_preemptions = _hostage_run("on_delivery", stalled=2)
    below = coupled_ttft - 0.1
    decoupled_ttft, decoupled_preemptions = _faster_of_two("on_finish", 2, below)
    baseline_ttft, baseline_preemptions = _faster_of_two("on_delivery", 0, below)
    assert decoupled_preemptions == 0 and baseline_preemptions == 0
    assert coupled_preemptions > 0
    # Queued behind held KV, the last fast reader waits for others to finish (>= 100 steps
    # of 2 ms); without held KV all six are admitted at once.
    assert coupled_ttft > 0.15
    assert coupled_ttft > decoupled_ttft + 0.1
    assert coupled_ttft > baseline_ttft + 0.1


def test_preemptions_when_blocks_run_out() -> None:
    cfg = _config("on_finish", block_size=16, num_blocks=16, max_model_len=256)
    with SimServer(cfg) as srv:
        _fast_readers(srv.url, 8, prompt_words=10, max_tokens=200)  # 8 x 210 > 256 slots
        m = scrape(srv.url)
        assert m["vllm:num_preemptions_total"] > 0
        assert m["vllm:request_success_total:length"] == 8
        assert m["vllm:kv_cache_usage_perc"] == 0
