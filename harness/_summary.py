"""Run summary: per-group latency and outcome figures, server figures and verdicts.

Written to ``summary.json`` (the model's JSON form) and printed as tables at the end of a run.
Latencies are in milliseconds, rates in tokens per second, KV usage in percent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel

from harness._saturation import SaturationSummary
from harness._stats import inter_chunk, per_token_itl, percentile


class GroupSummary(BaseModel):
    """Figures of one user group. Latencies in ms; ``None`` when nothing was measured."""

    group: str
    user_class: str | None
    requests: int
    outcomes: dict[str, int]
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    inter_chunk_p50_ms: float | None
    inter_chunk_p99_ms: float | None
    tpot_p50_ms: float | None
    e2e_p50_ms: float | None
    output_tokens: int
    output_tokens_per_s: float | None
    server_send_q_peak_bytes: int | None
    # The kernel's time-limited-by-the-client's-receive-window per request (tcpi_rwnd_limited).
    server_rwnd_limited_p50_ms: float | None = None
    server_rwnd_limited_max_ms: float | None = None


class ServerSummary(BaseModel):
    """Server figures from its /metrics. ``preemptions`` is the counter's rise over the run;
    ``missing_metrics`` names figures the server never reported; ``scrape_gap_max_s`` is the
    longest time between two scrapes (a starved harness samples less often than configured, and
    peaks between two scrapes are missed)."""

    kv_cache_usage_peak_perc: float | None
    preemptions: float | None
    running_peak: float | None
    waiting_peak: float | None
    request_success: dict[str, float]
    scrapes: int
    failed_scrapes: int
    scrape_gap_max_s: float | None
    missing_metrics: list[str]


class RunSummary(BaseModel):
    """The whole run's summary, as written to ``summary.json``."""

    scenario: str
    status: str  # "complete" | "failed" | "interrupted"
    failure: str | None
    duration_s: float
    groups: list[GroupSummary]
    server: ServerSummary
    verdicts: dict[str, Any]
    client_saturation: SaturationSummary
    # With [netem] capture: per flow that saw a zero window, who advertised it, the time from
    # the first zero window to the RST and who sent it (netem._wire.stalled_flows).
    stalled_flows: list[dict[str, Any]] | None = None


def _ms(values: list[float], q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else p * 1000.0


def _maybe(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def summarize_group(name: str, requests: pd.DataFrame, chunks: pd.DataFrame) -> GroupSummary:
    """Summarize the rows of ``requests`` and ``chunks`` that belong to group ``name``."""
    req = requests[requests["group"] == name]
    ch = chunks[(chunks["group"] == name) & (chunks["tokens"] > 0)].sort_values(["request_id", "t"])
    itl: list[float] = []
    gaps: list[float] = []
    for _, stream in ch.groupby("request_id", sort=False):
        times = stream["t"].tolist()
        itl.extend(per_token_itl(times, stream["tokens"].tolist()))
        gaps.extend(inter_chunk(times))
    tokens = int(req["completion_tokens"].sum()) if len(req) else 0
    span = None
    if len(req) and req["t_last_byte"].notna().any():
        span = float(req["t_last_byte"].max() - req["t_send"].min())
    peak_q = req["server_send_q_peak_bytes"].max() if len(req) else None
    user_class = str(req["user_class"].iloc[0]) if len(req) else None
    rwnd = (
        req["server_rwnd_limited_ms"].dropna()
        if "server_rwnd_limited_ms" in req
        else pd.Series(dtype=float)
    )
    return GroupSummary(
        group=name,
        user_class=user_class,
        requests=len(req),
        outcomes={str(k): int(v) for k, v in req["outcome"].value_counts().items()},
        ttft_p50_ms=percentile(req["ttft_ms"].dropna(), 50),
        ttft_p90_ms=percentile(req["ttft_ms"].dropna(), 90),
        ttft_p99_ms=percentile(req["ttft_ms"].dropna(), 99),
        itl_p50_ms=_ms(itl, 50),
        itl_p99_ms=_ms(itl, 99),
        inter_chunk_p50_ms=_ms(gaps, 50),
        inter_chunk_p99_ms=_ms(gaps, 99),
        tpot_p50_ms=percentile(req["tpot_ms"].dropna(), 50),
        e2e_p50_ms=percentile(req["e2e_ms"].dropna(), 50),
        output_tokens=tokens,
        output_tokens_per_s=tokens / span if span else None,
        server_send_q_peak_bytes=None if (q := _maybe(peak_q)) is None else int(q),
        server_rwnd_limited_p50_ms=percentile(rwnd, 50),
        server_rwnd_limited_max_ms=_maybe(rwnd.max()) if len(rwnd) else None,
    )


def summarize_server(metrics: pd.DataFrame, missing: list[str]) -> ServerSummary:
    """Summarize the scraped time series (columns as in ``server_metrics.parquet``)."""
    ok = metrics[metrics["scrape_ok"]] if len(metrics) else metrics

    def col(name: str) -> pd.Series:
        return ok[name].dropna() if name in ok else pd.Series(dtype=float)

    kv, pre = col("kv_cache_usage"), col("num_preemptions_total")
    success = {
        c.removeprefix("request_success_"): float(ok[c].dropna().iloc[-1])
        for c in ok.columns
        if c.startswith("request_success_") and ok[c].notna().any()
    }
    return ServerSummary(
        kv_cache_usage_peak_perc=float(kv.max() * 100.0) if len(kv) else None,
        preemptions=float(pre.iloc[-1] - pre.iloc[0]) if len(pre) else None,
        running_peak=_maybe(col("num_requests_running").max()),
        waiting_peak=_maybe(col("num_requests_waiting").max()),
        request_success=success,
        scrapes=len(metrics),
        scrape_gap_max_s=_maybe(metrics["t"].diff().max()) if len(metrics) > 1 else None,
        failed_scrapes=int((~metrics["scrape_ok"]).sum()) if len(metrics) else 0,
        missing_metrics=missing,
    )


def group_names(requests: pd.DataFrame, configured: list[str]) -> list[str]:
    """Configured group names first, then any others seen in the records."""
    seen = [g for g in pd.unique(requests["group"]) if g not in configured] if len(requests) else []
    return configured + [str(g) for g in seen]


def to_builtin(value: Any) -> Any:
    """numpy scalars to Python numbers, recursively, for JSON."""
    if isinstance(value, dict):
        return {k: to_builtin(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_builtin(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value
