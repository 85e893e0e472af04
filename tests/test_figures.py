"""Figures: the summary flattened into named numbers."""

from __future__ import annotations

from harness.runfolder import (
    GroupSummary,
    RunSummary,
    SaturationSummary,
    ServerSummary,
    figure_names,
    figures,
)


def _summary() -> RunSummary:
    group = GroupSummary(
        group="fast",
        user_class="fast",
        requests=3,
        outcomes={"complete": 2, "cut_by_peer": 1},
        ttft_p50_ms=10.0,
        ttft_p90_ms=20.0,
        ttft_p99_ms=30.0,
        itl_p50_ms=None,
        itl_p99_ms=None,
        inter_chunk_p50_ms=None,
        inter_chunk_p99_ms=None,
        tpot_p50_ms=None,
        e2e_p50_ms=None,
        output_tokens=12,
        output_tokens_per_s=None,
        server_send_q_peak_bytes=None,
    )
    server = ServerSummary(
        kv_cache_usage_peak_perc=50.0,
        preemptions=4.0,
        running_peak=2,
        waiting_peak=0,
        request_success={},
        scrapes=5,
        failed_scrapes=0,
        scrape_gap_max_s=0.3,
        missing_metrics=[],
    )
    saturation = SaturationSummary(
        cpu_limit_pct=85,
        lag_limit_ms=5,
        max_fraction=0.1,
        processes=[],
        unsampled=[],
        saturated=True,
        message="client saturated",
    )
    return RunSummary(
        scenario="s",
        status="complete",
        failure=None,
        duration_s=9.5,
        groups=[group],
        server=server,
        client_saturation=saturation,
        verdicts={"kv_held_by_undelivered_streams": {"kv_held_s": 1.5, "kv_seconds": 0.2}},
    )


def test_figures_flatten_groups_server_and_verdicts() -> None:
    f = figures(_summary())
    assert f["fast.ttft_p99_ms"] == 30.0
    assert f["fast.itl_p99_ms"] is None
    assert f["fast.outcome.cut_by_peer"] == 1.0
    assert f["fast.outcome.timeout"] == 0.0
    assert f["server.preemptions"] == 4.0
    assert f["kv_held_after_finish_s"] == 1.5
    assert f["kv_held_peak_perc"] is None
    assert f["client_saturated"] == 1.0
    assert "fast.user_class" not in f and "server.missing_metrics" not in f


def test_every_figure_has_a_valid_name() -> None:
    names = set(figure_names(["fast"]))
    assert set(figures(_summary())) <= names
    assert "slow.ttft_p99_ms" not in names
