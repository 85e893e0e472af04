"""Run summary: per-group latency and outcome figures, server figures and verdicts.

Written to ``summary.json`` (the model's JSON form) and printed as tables at the end of a run.
Latencies are in milliseconds, rates in tokens per second, KV usage in percent.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from harness.analysis._latency import inter_chunk_s, per_token_itl_s, percentile
from harness.analysis._leaves import leave_summary
from harness.analysis._sessions import session_figures
from harness.analysis._stalls import generation_tokens, undelivered_tokens
from harness.runfolder import GroupSummary, ServerSummary


def _ms(values: np.ndarray, q: float) -> float | None:
    p = percentile(values, q)
    return None if p is None else p * 1000.0


def _maybe(value: Any) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def summarize_group(name: str, requests: pd.DataFrame, chunks: pd.DataFrame) -> GroupSummary:
    """Summarize the rows of ``requests`` and ``chunks`` that belong to group ``name``."""
    req = requests[requests["group"] == name]
    ch = chunks[chunks["group"] == name]
    itl = per_token_itl_s(ch)
    gaps = inter_chunk_s(ch)
    tokens = int(req["completion_tokens"].sum()) if len(req) else 0
    span = None
    if len(req) and req["t_last_byte"].notna().any():
        span = float(req["t_last_byte"].max() - req["t_send"].min())
    peak_q = req["server_send_q_peak_bytes"].max() if len(req) else None
    user_class = str(req["user_class"].iloc[0]) if len(req) else None
    stalled = req[req["t_stall"].notna()] if "t_stall" in req else req.iloc[0:0]
    cut = stalled[stalled["t_cut_seen"].notna()] if len(stalled) else stalled
    to_cut = cut["stall_to_cut_ms"].dropna() if len(cut) else pd.Series(dtype=float)
    to_abort = (
        stalled["stall_to_abort_ms"].dropna()
        if "stall_to_abort_ms" in stalled
        else pd.Series(dtype=float)
    )
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
        inter_chunk_mean_ms=float(np.mean(gaps)) * 1000.0 if gaps.size else None,
        whole_answers=int((~req["stream"].astype(bool)).sum()) if "stream" in req else 0,
        stalled=len(stalled),
        cut_seen=len(cut),
        cut_rst=int((cut["cut_kind"] == "rst").sum()) if len(cut) else 0,
        stall_to_cut_p50_ms=percentile(to_cut, 50),
        stall_to_cut_max_ms=_maybe(to_cut.max()) if len(to_cut) else None,
        engine_aborted=len(to_abort),
        stall_to_abort_p50_ms=percentile(to_abort, 50),
        stall_to_abort_max_ms=_maybe(to_abort.max()) if len(to_abort) else None,
        server_rwnd_limited_p50_ms=percentile(rwnd, 50),
        server_rwnd_limited_max_ms=_maybe(rwnd.max()) if len(rwnd) else None,
        requests_kernel_stamped=(
            int((req["timestamps"] == "kernel").sum()) if "timestamps" in req else 0
        ),
        read_lag_max_ms=_maybe(req["read_lag_max_ms"].max()) if "read_lag_max_ms" in req else None,
        **_open_loop_figures(req),
        **_leave_figures(req),
        **session_figures(req),
        **prefix_cache_figures(req),
    )


def prefix_cache_figures(req: pd.DataFrame) -> dict[str, Any]:
    """``prompt_cached_tokens`` (summed) and ``prefix_hit_ratio`` (cached over prompt tokens,
    0..1) of the requests whose engine record says both (``requests.parquet``'s
    ``prompt_cached_tokens`` and ``engine_prompt_tokens``); ``{}`` when none does."""
    if "prompt_cached_tokens" not in req or "engine_prompt_tokens" not in req:
        return {}
    known = req[req["prompt_cached_tokens"].notna() & req["engine_prompt_tokens"].notna()]
    prompt = float(known["engine_prompt_tokens"].sum())
    if not prompt:
        return {}
    cached = int(known["prompt_cached_tokens"].sum())
    return {"prompt_cached_tokens": cached, "prefix_hit_ratio": cached / prompt}


def _leave_figures(req: pd.DataFrame) -> dict[str, Any]:
    """The ``left``/``leave_*`` fields of a group's summary (zero and ``None`` without leaves)."""
    gone = req[req["t_leave"].notna()] if "t_leave" in req else req.iloc[0:0]
    return leave_summary(gone) if len(gone) else {}


def summarize_requests(name: str, requests: pd.DataFrame, chunks: pd.DataFrame) -> GroupSummary:
    """Summarize exactly the rows of ``requests`` (of any groups) under ``name``, with their
    chunks (found in ``chunks`` by request id): a client-mix behaviour, a sweep's swept
    groups pooled."""
    theirs = chunks[chunks["request_id"].isin(requests["request_id"])]
    return summarize_group(name, requests.assign(group=name), theirs.assign(group=name))


def _open_loop_figures(req: pd.DataFrame) -> dict[str, float | None]:
    """Send lag, sent rate and latencies from the scheduled send of an open-loop group's
    requests (all ``None`` in a closed loop)."""
    if "t_scheduled" not in req or not req["t_scheduled"].notna().any():
        return {}
    lag = req["send_lag_ms"].dropna()
    ttft, e2e = req["ttft_from_scheduled_ms"].dropna(), req["e2e_from_scheduled_ms"].dropna()
    sends = req["t_send"].dropna()
    span = float(sends.max() - sends.min()) if len(sends) > 1 else 0.0
    return {
        "send_lag_p50_ms": percentile(lag, 50),
        "send_lag_p99_ms": percentile(lag, 99),
        "send_lag_max_ms": _maybe(lag.max()) if len(lag) else None,
        "sent_rps": (len(sends) - 1) / span if span > 0 else None,
        "ttft_from_scheduled_p50_ms": percentile(ttft, 50),
        "ttft_from_scheduled_p99_ms": percentile(ttft, 99),
        "e2e_from_scheduled_p50_ms": percentile(e2e, 50),
        "e2e_from_scheduled_p99_ms": percentile(e2e, 99),
    }


def summarize_server(
    metrics: pd.DataFrame, missing: list[str], requests: pd.DataFrame | None = None
) -> ServerSummary:
    """Summarize the scraped time series (columns as in ``server_metrics.parquet``);
    ``requests`` (the run's ``requests_frame``) gives ``undelivered_tokens``."""
    ok = metrics[metrics["scrape_ok"]] if len(metrics) else metrics

    def col(name: str) -> pd.Series:
        return ok[name].dropna() if name in ok else pd.Series(dtype=float)

    kv, pre = col("kv_cache_usage"), col("num_preemptions_total")
    success = {
        c.removeprefix("request_success_"): float(ok[c].dropna().iloc[-1] - ok[c].dropna().iloc[0])
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
        generation_tokens=generation_tokens(metrics),
        undelivered_tokens=None if requests is None else undelivered_tokens(metrics, requests),
        slots_busy_peak=_maybe(col("slots_busy").max()),
        **process_summary(metrics),
    )


def process_summary(metrics: pd.DataFrame) -> dict[str, float | None]:
    """The engine process's threads (first sample, peak) and RSS (peak, growth over the first
    sample; MB) from the scrapes' ``server_threads`` / ``server_rss_bytes`` (every sample,
    answered or not: a server too busy to answer is the interesting case)."""
    out: dict[str, float | None] = {}
    threads = metrics["server_threads"].dropna() if "server_threads" in metrics else None
    if threads is not None and len(threads):
        out["server_threads_start"] = float(threads.iloc[0])
        out["server_threads_peak"] = float(threads.max())
    rss = metrics["server_rss_bytes"].dropna() if "server_rss_bytes" in metrics else None
    if rss is not None and len(rss):
        out["server_rss_peak_mb"] = float(rss.max()) / 1e6
        out["server_rss_growth_mb"] = float(rss.max() - rss.iloc[0]) / 1e6
    return out


def group_names(requests: pd.DataFrame, configured: list[str]) -> list[str]:
    """Configured group names first, then any others seen in the records."""
    seen = [g for g in pd.unique(requests["group"]) if g not in configured] if len(requests) else []
    return configured + [str(g) for g in seen]
