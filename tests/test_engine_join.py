"""The per-request join of engine and client records, and the verdict from it (synthetic
tables; the real engines are in test_vllm_run.py and test_sim_engine_tables.py)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from harness._engine_probe import REQUEST_SCHEMA, STEP_SCHEMA
from harness.analysis._engine import (
    combine_verdicts,
    engine_server_figures,
    engine_verdict_line,
    kv_held_from_requests,
    probe_problem,
)
from harness.analysis._engine_join import engine_aborts, join_engine, stream_of
from harness.analysis._summary import prefix_cache_figures


def test_stream_of_takes_the_longest_prefix_at_a_dash():
    streams = {"cmpl-ab", "cmpl-ab-0", "chatcmpl-x"}
    assert stream_of("cmpl-ab-0-1234abcd", streams) == "cmpl-ab-0"
    assert stream_of("cmpl-ab-1-1234abcd", streams) == "cmpl-ab"
    assert stream_of("chatcmpl-x", streams) == "chatcmpl-x"
    assert stream_of("cmpl-abc-0-1", streams) is None  # not at a dash
    assert stream_of("other", streams) is None


def _client(rid: str, *, outcome: str, last: float, tokens_at: list[float]) -> dict:
    return {
        "request_id": rid,
        "stream_id": f"cmpl-{rid}",
        "outcome": outcome,
        "t_last_byte": last,
        "chunks": tokens_at,
    }


def _frames(clients: list[dict], engine_rows: list[dict]):
    requests = pd.DataFrame([{k: v for k, v in c.items() if k != "chunks"} for c in clients])
    chunks = pd.DataFrame(
        [
            {"request_id": c["request_id"], "t": t, "tokens": 1, "bytes": 100}
            for c in clients
            for t in c["chunks"]
        ]
    )
    base = {name: None for name in REQUEST_SCHEMA.names}
    engine = pd.DataFrame([{**base, **row} for row in engine_rows])
    return requests, chunks, engine


def _engine(rid: str, *, end: float, freed: float, tokens: int, blocks: int = 4) -> dict:
    return {
        "engine_request_id": f"cmpl-{rid}-0-deadbeef",
        "t_arrival": 0.0,
        "t_first_scheduled": 0.01,
        "t_first_token": 0.1,
        "t_generation_end": end,
        "t_kv_freed": freed,
        "finish_reason": "length",
        "output_tokens": tokens,
        "preempted_at": [0.5],
        "resumed_at": [0.6],
        "kv_blocks_peak": blocks,
        "kv_blocks_freed": blocks,
    }


def test_a_stalled_client_whose_kv_was_freed_at_generation_end_is_none_held():
    clients = [
        _client("fast", outcome="complete", last=1.002, tokens_at=[0.1 * i for i in range(1, 11)]),
        _client("slow", outcome="client_abort", last=0.3, tokens_at=[0.1, 0.2, 0.3]),
    ]
    engine = [
        _engine("fast", end=1.0, freed=1.0005, tokens=10),
        _engine("slow", end=1.0, freed=1.0005, tokens=10),
        {"engine_request_id": "cmpl-warmup-0-1", "t_generation_end": 0.0, "t_kv_freed": 0.0},
    ]
    joined, unjoined = join_engine(*_frames(clients, engine))
    assert unjoined == 1
    row = joined.set_index("request_id")
    assert row.loc["fast", "engine_request_id"] == "cmpl-fast-0-deadbeef"
    assert row.loc["fast", "delivery_lag_ms"] == pytest.approx(2.0)
    assert np.isnan(row.loc["slow", "delivery_lag_ms"])  # never received the whole stream
    assert row.loc["slow", "kv_held_after_generation_ms"] == pytest.approx(0.5)
    assert row.loc["slow", "undelivered_tokens_at_kv_free"] == 7
    assert row.loc["slow", "undelivered_bytes_at_kv_free"] == pytest.approx(700)
    assert row.loc["fast", "engine_preemptions"] == 1
    verdict = kv_held_from_requests(joined, pd.DataFrame(), held_min_ms=100, unjoined=unjoined)
    assert verdict["status"] == "none"
    assert verdict["requests"] == 2 and verdict["requests_undelivered_at_kv_free"] == 1


def test_kv_freed_only_after_delivery_is_held_with_its_span_and_usage():
    clients = [_client("slow", outcome="complete", last=5.0, tokens_at=[0.1, 0.2, 5.0])]
    engine = [_engine("slow", end=1.0, freed=5.0, tokens=3)]
    joined, _ = join_engine(*_frames(clients, engine))
    steps = pd.DataFrame(
        {"t": [0.5, 1.0, 3.0], "kv_cache_usage": [0.2, 0.5, 0.25]}
    )  # the usage at 1.0 holds until 3.0, then 0.25 until the span ends at 5.0
    verdict = kv_held_from_requests(joined, steps, held_min_ms=100, unjoined=0)
    assert verdict["status"] == "held" and verdict["requests_held"] == 1
    assert verdict["kv_held_s"] == pytest.approx(4.0)
    assert verdict["kv_held_peak_perc"] == pytest.approx(50.0)
    assert verdict["kv_seconds"] == pytest.approx(0.5 * 2.0 + 0.25 * 2.0)
    assert verdict["kv_held_peak_of"] == "usage"  # the pool's size unknown
    assert verdict["kv_held_peak_bytes"] is None and verdict["kv_cache_bytes"] is None


def test_the_held_peak_is_the_held_requests_own_blocks_not_the_victims():
    clients = [
        _client(r, outcome="complete", last=5.0, tokens_at=[0.1, 0.2, 5.0]) for r in ("a", "b")
    ]
    engine = [
        _engine("a", end=1.0, freed=5.0, tokens=3, blocks=10),
        _engine("b", end=2.0, freed=4.0, tokens=3, blocks=6),
    ]
    joined, _ = join_engine(*_frames(clients, engine))
    # victims fill the rest of the 64 blocks meanwhile: usage 100 %
    steps = pd.DataFrame({"t": [0.5, 1.0, 3.0], "kv_cache_usage": [0.2, 0.5, 1.0]})
    verdict = kv_held_from_requests(
        joined, steps, held_min_ms=100, unjoined=0, kv_cache_blocks=64, kv_block_bytes=32768
    )
    assert verdict["kv_held_peak_of"] == "held_blocks"
    assert verdict["kv_held_peak_perc"] == pytest.approx(100.0 * 16 / 64)  # a and b at once
    # in bytes: 16 blocks of 32 KiB (the tiny model's) of a pool of 64
    assert verdict["kv_held_peak_bytes"] == 16 * 32768 and verdict["kv_cache_bytes"] == 2 * 2**20
    assert "peak KV 25.0 % = 512.0 KiB" in engine_verdict_line(verdict)
    assert joined.set_index("request_id").loc["a", "engine_kv_blocks_freed"] == 10


def test_held_requests_sharing_prefix_blocks_count_each_block_in_use_once():
    clients = [
        _client(r, outcome="complete", last=5.0, tokens_at=[0.1, 0.2, 5.0]) for r in ("a", "b")
    ]
    engine = [  # both hold the same 6 prefix blocks and 4 of their own: 14 blocks in use
        _engine("a", end=1.0, freed=5.0, tokens=3, blocks=10),
        _engine("b", end=1.0, freed=5.0, tokens=3, blocks=10),
    ]
    joined, _ = join_engine(*_frames(clients, engine))
    steps = pd.DataFrame(
        {"t": [0.5, 1.0], "kv_cache_usage": [14 / 64, 14 / 64], "kv_blocks_in_use": [14, 14],
         "kv_blocks_cached_free": [3, 3]}
    )  # fmt: skip
    verdict = kv_held_from_requests(joined, steps, held_min_ms=100, unjoined=0, kv_cache_blocks=64)
    assert verdict["kv_held_peak_perc"] == pytest.approx(100.0 * 14 / 64)  # not 20: shared once


def test_the_prefix_cache_hits_join_each_request_and_make_its_groups_ratio():
    clients = [
        _client(r, outcome="complete", last=1.0, tokens_at=[0.5, 1.0]) for r in ("a", "b", "c")
    ]
    engine = [
        {**_engine("a", end=1.0, freed=1.0, tokens=2), "prompt_tokens": 300,
         "prompt_cached_tokens": 0},
        {**_engine("b", end=1.0, freed=1.0, tokens=2), "prompt_tokens": 300,
         "prompt_cached_tokens": 288},
        _engine("c", end=1.0, freed=1.0, tokens=2),  # an engine that does not say
    ]  # fmt: skip
    joined, _ = join_engine(*_frames(clients, engine))
    rows = joined.set_index("request_id")
    assert rows.loc["b", "prompt_cached_tokens"] == 288
    assert rows.loc["b", "engine_prompt_tokens"] == 300
    assert np.isnan(rows.loc["c", "prompt_cached_tokens"])
    assert prefix_cache_figures(joined) == {"prompt_cached_tokens": 288, "prefix_hit_ratio": 0.48}
    assert prefix_cache_figures(joined[joined["request_id"] == "c"]) == {}


def test_fast_readers_only_are_not_observed():
    clients = [_client("a", outcome="complete", last=1.01, tokens_at=[0.5, 1.01])]
    joined, _ = join_engine(*_frames(clients, [_engine("a", end=1.0, freed=1.0, tokens=2)]))
    verdict = kv_held_from_requests(joined, pd.DataFrame(), held_min_ms=100, unjoined=0)
    assert verdict["status"] == "not_observed"


def test_combined_verdict_flags_a_disagreement_and_says_scrape_only():
    scrapes = {"status": "held", "line": "scrape line", "undelivered_peak_bytes": 5,
               "t_generation_end": 1.0, "window_s": 2.0}  # fmt: skip
    engine = {"status": "none", "requests": 2, "requests_held": 0,
              "requests_undelivered_at_kv_free": 1, "undelivered_bytes_at_kv_free": 2e6,
              "kv_held_after_generation_max_ms": 0.4}  # fmt: skip
    both = combine_verdicts(engine, scrapes, None)
    assert both["agreement"] == "disagree" and "DISAGREES" in both["line"]
    assert both["line"].startswith("KV held by undelivered streams: none held: 2 of 2")
    # Engine records with nothing undelivered at generation end beside scrapes that saw nothing
    # held: neither saw KV held, so they agree.
    quiet = combine_verdicts(
        {**engine, "status": "not_observed"}, {**scrapes, "status": "none"}, None
    )
    assert quiet["agreement"] == "agree" and "DISAGREES" not in quiet["line"]
    alone = combine_verdicts(None, scrapes, "a url target")
    assert alone["source"] == "scrapes" and alone["line"].endswith("[scrape-only: a url target]")


def test_probe_problem_names_why_tables_cannot_be_used():
    some = pd.DataFrame({"engine_request_id": ["x"]})
    assert probe_problem(None, some) is not None
    assert "boom" in str(probe_problem({"status": "failed", "reason": "boom"}, some))
    assert probe_problem({"status": "running"}, some.iloc[0:0]) is not None
    assert probe_problem({"status": "running"}, some) is None


def test_server_figures_from_steps_count_preemptions_from_the_engine_start():
    steps = pd.DataFrame(
        {
            "t": [1.0, 2.0, 3.0],
            "step": [0, 1, 2],
            "kv_cache_usage": [0.5, 1.0, 0.0],
            "num_requests_running": [3, 4, 0],
            "num_requests_waiting": [1, 2, 0],
            "num_preemptions_total": [1, 3, 3],
            "num_scheduled_tokens": [10, 4, 1],
            "kv_blocks_in_use": [32, 63, 0],
            "kv_blocks_cached_free": [0, 0, 40],
        }
    )
    assert set(steps.columns) == set(STEP_SCHEMA.names)
    fig = engine_server_figures(steps)
    assert fig["kv_cache_usage_peak_perc"] == 100.0 and fig["preemptions"] == 3.0
    assert fig["running_peak"] == 4.0 and fig["waiting_peak"] == 2.0
    assert fig["kv_blocks_in_use_peak"] == 63 and fig["kv_blocks_cached_free_peak"] == 40
    # Steps of an engine that does not count its blocks: the figures are not measured.
    old = engine_server_figures(steps.drop(columns=["kv_blocks_in_use", "kv_blocks_cached_free"]))
    assert old["kv_blocks_in_use_peak"] is None and old["kv_blocks_cached_free_peak"] is None
    # A slice of a shared engine's steps: only the rises within it.
    assert engine_server_figures(steps.iloc[1:].assign(step=[5, 6]))["preemptions"] == 0.0


def test_engine_aborts_come_from_the_engine_records():
    clients = [
        _client("gone", outcome="client_abort", last=0.2, tokens_at=[0.1, 0.2]),
        _client("done", outcome="complete", last=1.0, tokens_at=[0.5, 1.0]),
    ]
    engine = [
        {**_engine("gone", end=2.5, freed=2.5, tokens=30), "finish_reason": "abort"},
        _engine("done", end=1.0, freed=1.0, tokens=2),
    ]
    joined, _ = join_engine(*_frames(clients, engine))
    joined["t_stall"] = [0.2, np.nan]
    out = engine_aborts(joined).set_index("request_id")
    assert out.loc["gone", "t_engine_abort"] == 2.5
    assert out.loc["gone", "stall_to_abort_ms"] == pytest.approx(2300.0)
    assert np.isnan(out.loc["done", "t_engine_abort"])


def test_overlapping_held_requests_count_each_moment_once():
    clients = [
        _client("a", outcome="client_abort", last=0.2, tokens_at=[0.1]),
        _client("b", outcome="client_abort", last=0.2, tokens_at=[0.1]),
    ]
    engine = [
        _engine("a", end=1.0, freed=5.0, tokens=3),
        _engine("b", end=2.0, freed=4.0, tokens=3),
    ]
    joined, _ = join_engine(*_frames(clients, engine))
    steps = pd.DataFrame({"t": [0.0], "kv_cache_usage": [0.5]})
    verdict = kv_held_from_requests(joined, steps, held_min_ms=100, unjoined=0)
    assert verdict["requests_held"] == 2
    assert verdict["kv_held_s"] == pytest.approx(4.0)  # 1..5, not 4 + 2
    assert verdict["kv_seconds"] == pytest.approx(2.0)  # never above 100 % of the span


def test_the_line_rounds_the_free_time_up():
    engine = {"status": "none", "requests": 3, "requests_held": 0,
              "requests_undelivered_at_kv_free": 1, "undelivered_bytes_at_kv_free": 5e5,
              "kv_held_after_generation_max_ms": 0.146}  # fmt: skip
    scrapes = {"status": "none", "line": "", "undelivered_peak_bytes": 0,
               "t_generation_end": None, "window_s": 0.0}  # fmt: skip
    assert "within 0.2 ms" in combine_verdicts(engine, scrapes, None)["line"]


def test_a_single_context_engine_paused_for_a_stalled_reader_is_held_with_its_victims():
    """llama-cpp-python's shape: the stalled stream's generation waited for send 1.0-9.0 s
    while it kept the one context (1 of 1); a victim arrived at 3.0 and got the lock at 9.0."""
    clients = [
        _client("stalled", outcome="client_abort", last=0.9, tokens_at=[0.1, 0.2, 0.9]),
        _client("victim", outcome="complete", last=9.2, tokens_at=[9.1, 9.2]),
    ]
    stalled = {
        **_engine("stalled", end=1.0, freed=9.0, tokens=300, blocks=1),
        "t_generation_end": 1.0,
        "finish_reason": "abort",
        "send_blocked_at": [0.4, 1.0],
        "send_unblocked_at": [0.42, 9.0],  # a 20 ms hand-over, then the stall
    }
    victim = {
        **_engine("victim", end=9.2, freed=9.2, tokens=2, blocks=1),
        "t_arrival": 3.0,
        "t_first_scheduled": 9.0,
    }
    joined, _ = join_engine(*_frames(clients, [stalled, victim]))
    row = joined.set_index("request_id")
    assert row.loc["stalled", "engine_send_blocked_max_ms"] == pytest.approx(8000.0)
    assert row.loc["victim", "engine_send_blocked_max_ms"] == 0.0
    from harness.analysis._engine_join import send_blocked_spans

    engine = _frames(clients, [stalled, victim])[2]
    spans = send_blocked_spans(engine, 100)
    assert spans == {"cmpl-stalled-0-deadbeef": [(1.0, 9.0)]}  # a 20 ms hand-over is no pause
    verdict = kv_held_from_requests(
        joined, pd.DataFrame(), held_min_ms=100, unjoined=0, kv_cache_blocks=1,
        blocked_spans=spans,
    )  # fmt: skip
    assert verdict["status"] == "held"
    assert verdict["requests_held_during_generation"] == 1
    assert verdict["kv_held_s"] == pytest.approx(8.0)
    assert verdict["kv_held_peak_perc"] == pytest.approx(100.0)
    assert verdict["victims"] == 1
    assert verdict["victim_wait_max_ms"] == pytest.approx(6000.0)
    line = engine_verdict_line(verdict)
    assert "HELD" in line and "8000 ms in one pause" in line and "queued behind" in line


def test_a_fast_reader_paced_by_a_slow_send_path_is_not_held():
    """Its generation waited for send (the HTTP side slower than the engine), but its client
    received every token as it came: the engine was not held by undelivered output."""
    clients = [_client("fast", outcome="complete", last=2.001, tokens_at=[0.5, 1.0, 2.001])]
    row = {
        **_engine("fast", end=2.0, freed=2.0, tokens=3, blocks=1),
        "send_blocked_at": [0.2],
        "send_unblocked_at": [1.9],
    }
    joined, _ = join_engine(*_frames(clients, [row]))
    from harness.analysis._engine_join import send_blocked_spans

    spans = send_blocked_spans(_frames(clients, [row])[2], 100)
    verdict = kv_held_from_requests(
        joined, pd.DataFrame(), held_min_ms=100, unjoined=0, kv_cache_blocks=1,
        blocked_spans=spans,
    )  # fmt: skip
    assert verdict["status"] == "not_observed" and verdict["requests_held"] == 0
