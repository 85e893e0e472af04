"""The verdict "engine held by undelivered streams" from the engine's own records, joined with
what each client received (``harness.analysis._engine_join``): which requests kept KV (or the
engine's one context) while their output waited for delivery, how long, how much, who queued
behind them, and the verdict line; and the server figures from the engine's own steps.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """``intervals`` merged where they overlap, in order."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(intervals):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _steps_over(steps: pd.DataFrame, a: float, b: float) -> slice:
    """The steps whose values hold over ``[a, b]``: the last one at or before ``a`` and every
    one up to ``b`` (each step's values hold until the next step; an idle engine takes none)."""
    t = steps["t"].to_numpy()
    start = max(int(np.searchsorted(t, a, side="right")) - 1, 0)
    return slice(start, int(np.searchsorted(t, b, side="right")))


def _usage_over(steps: pd.DataFrame, a: float, b: float) -> tuple[float, float]:
    """Peak KV usage (0..1) and its integral (fraction × s) over ``[a, b]``."""
    if not len(steps):
        return 0.0, 0.0
    window = _steps_over(steps, a, b)
    ts, us = steps["t"].to_numpy()[window], steps["kv_cache_usage"].to_numpy()[window]
    if not len(ts):
        return 0.0, 0.0
    edges = np.clip(np.append(ts, b), a, b)
    return float(us.max()), float((us * np.diff(edges)).sum())


def _held_blocks_peak(held: pd.DataFrame) -> float:
    """The most KV blocks the held requests kept at once: each holds its
    ``engine_kv_blocks_freed`` from its generation end to its free."""
    blocks = held["engine_kv_blocks_freed"].astype(int)
    holds = zip(held["t_generation_end"], held["t_kv_freed"], blocks, strict=True)
    events = sorted(
        (t, n) for a, b, n in holds for t, n in ((float(a), int(n)), (float(b), -int(n)))
    )  # at the same instant a free (negative) comes before a hold
    level = peak = 0
    for _, n in events:
        level += n
        peak = max(peak, level)
    return float(peak)


def engine_server_figures(steps: pd.DataFrame) -> dict[str, Any]:
    """Peak KV usage (%), preemptions, peak running and waiting, the step count and the peak
    KV blocks in use and cached-free (where the steps have them), from the engine's steps
    (``engine_steps.parquet``); ``{}`` when there are none. Preemptions count the rises of the
    engine's total, plus the total at its first step when the table begins at the engine's
    first step. KV usage counts blocks in use only: vLLM's ``BlockPool.get_usage``
    (vllm/v1/core/block_pool.py) is 1 - free / (blocks - 1), and a block free but kept by
    the prefix cache is in the free queue."""
    if not len(steps):
        return {}
    total = steps["num_preemptions_total"].astype(float)
    preemptions = float(total.diff().clip(lower=0).sum())
    if int(steps["step"].iloc[0]) == 0:
        preemptions += float(total.iloc[0])
    return {
        "kv_cache_usage_peak_perc": float(steps["kv_cache_usage"].max() * 100.0),
        "preemptions": preemptions,
        "running_peak": float(steps["num_requests_running"].max()),
        "waiting_peak": float(steps["num_requests_waiting"].max()),
        "engine_steps": len(steps),
        **{
            f"{col}_peak": _maybe_max(steps, col)
            for col in ("kv_blocks_in_use", "kv_blocks_cached_free")
        },
    }


def _maybe_max(steps: pd.DataFrame, col: str) -> float | None:
    """The largest value of ``col`` (``None`` where the table lacks it or holds none)."""
    values = steps[col].dropna() if col in steps else pd.Series(dtype=float)
    return float(values.max()) if len(values) else None


def _victims(joined: pd.DataFrame, spans: list[tuple[float, float]]) -> pd.DataFrame:
    """Requests that waited to be scheduled (engine arrival to first scheduled) during one of
    ``spans``: queued behind a request that held the engine."""
    if not spans or "t_engine_first_scheduled" not in joined:
        return joined.iloc[0:0]
    arrival, scheduled = joined["t_engine_arrival"], joined["t_engine_first_scheduled"]
    waited = pd.Series(False, index=joined.index)
    for a, b in spans:
        waited |= (arrival < b) & (scheduled > a)
    return joined[waited & arrival.notna() & scheduled.notna()]


def _held_spans(
    done: pd.DataFrame,
    after: pd.Series,
    during: pd.Series,
    blocked_spans: dict[str, list[tuple[float, float]]],
) -> list[tuple[float, float]]:
    """The time in which at least one request held the engine, each moment counted once: the
    held-after-generation requests' generation end to KV free, and the held-during-generation
    requests' send-blocked spans."""
    ends = zip(done.loc[after, "t_generation_end"], done.loc[after, "t_kv_freed"], strict=True)
    blocked = [
        span
        for eid in done.loc[during, "engine_request_id"]
        for span in blocked_spans.get(str(eid), [])
    ]
    return _union([(float(a), float(b)) for a, b in ends] + blocked)


def _in_use_peak(steps: pd.DataFrame, spans: list[tuple[float, float]]) -> float | None:
    """The most KV blocks in use (``kv_blocks_in_use``) at the steps over ``spans``; ``None``
    where the steps do not count them."""
    if "kv_blocks_in_use" not in steps or not spans or not steps["kv_blocks_in_use"].notna().any():
        return None
    blocks = steps["kv_blocks_in_use"].astype(float).to_numpy()
    return float(max(np.nanmax(blocks[_steps_over(steps, a, b)], initial=0.0) for a, b in spans))


def _held_peak(
    done: pd.DataFrame,
    after: pd.Series,
    during: pd.Series,
    usage: list[tuple[float, float]],
    kv_cache_blocks: int | None,
    in_use_peak: float | None = None,
) -> tuple[float, str]:
    """The most KV the held requests kept at once (0..1) and what it is of: their own blocks
    over the pool (``held_blocks``), or, without the pool's size, the engine's peak usage over
    the held spans, victims admitted meanwhile included (``usage``). Only blocks in use count:
    a prefix block shared by several held requests is in each one's ``kv_blocks_freed``, so
    the held blocks are capped at ``in_use_peak``, the engine's most blocks in use over the
    held spans (``None``: steps that do not count them; cached-free blocks are never in use)."""
    held = done[after | during]
    if kv_cache_blocks and len(held) and held["engine_kv_blocks_freed"].notna().all():
        blocks = _held_blocks_peak(done[after])
        if during.any():
            blocks = max(blocks, float(done.loc[during, "engine_kv_blocks_freed"].max()))
        if in_use_peak is not None:
            blocks = min(blocks, in_use_peak)
        return blocks / kv_cache_blocks, "held_blocks"
    return max((p for p, _ in usage), default=0.0), "usage"


def _in_bytes(
    peak: float, kv_cache_blocks: int | None, kv_block_bytes: int | None
) -> dict[str, int | None]:
    """``kv_cache_bytes``, the pool in bytes (``kv_cache_blocks`` x ``kv_block_bytes``, the
    bytes one block takes: ``engine_probe.json``), and ``kv_held_peak_bytes``, the held
    ``peak`` (0..1 of the pool) in bytes; ``None`` where the engine gave either not."""
    if not kv_cache_blocks or not kv_block_bytes:
        return {"kv_held_peak_bytes": None, "kv_cache_bytes": None}
    pool = kv_cache_blocks * kv_block_bytes
    return {"kv_held_peak_bytes": round(peak * pool), "kv_cache_bytes": pool}


def kv_held_from_requests(
    joined: pd.DataFrame,
    steps: pd.DataFrame,
    *,
    held_min_ms: float,
    unjoined: int,
    kv_cache_blocks: int | None = None,
    kv_block_bytes: int | None = None,
    blocked_spans: dict[str, list[tuple[float, float]]] | None = None,
) -> dict[str, Any]:
    """The verdict "engine held by undelivered streams" from per-request evidence (``joined``:
    ``join_engine``'s frame). A request held the engine in either of two ways:

    - **after generation** (paged KV: vLLM, the emulator): its KV was freed more than
      ``held_min_ms`` after its generation ended while its client still lacked output at
      generation end (it never received the whole stream, or received it more than
      ``held_min_ms`` after generation ended);
    - **during generation** (a single-context engine: llama-cpp-python): its generation waited
      more than ``held_min_ms`` in one span for the server's send path while the request kept
      the engine (``engine_send_blocked_max_ms``; the spans by engine request id are
      ``blocked_spans``, ``send_blocked_spans``), and its client lacked output at
      generation end as above (a fast reader behind a slow send path paces generation too,
      but its output is delivered).

    ``held`` if any request did; ``none`` if some request's KV was freed while its client
    still lacked output (the engine did not wait for delivery); ``not_observed`` if no request
    had output undelivered when its generation ended. Figures: ``kv_held_s`` (the union of the
    held spans, generation-end-to-free and send-blocked: each moment counted once),
    ``kv_held_peak_perc`` (the most KV the held requests kept at once, their ``kv_blocks_freed``
    (at most the blocks in use) over ``kv_cache_blocks``, the pool (``engine_probe.json``):
    ``"held_blocks"`` in ``kv_held_peak_of``; without the pool's size, the peak KV usage of the
    engine's steps over the union, victims admitted meanwhile included: ``"usage"``), the pool
    and that peak in bytes (:func:`_in_bytes`), ``kv_seconds`` (the engine's KV usage
    integrated over the union: an upper bound while victims ran), ``victims`` and
    ``victim_wait_max_ms`` (requests that waited to be scheduled during a held span, and the
    longest such wait from arrival to first scheduled), counts, and the spread of
    KV-held-after-generation times.
    """
    done = joined[joined["t_kv_freed"].notna() & joined["t_generation_end"].notna()]
    held_ms = done["kv_held_after_generation_ms"]
    # Output counts as undelivered for a client that never received the whole stream, or
    # received it more than held_min_ms after generation ended (not the last bytes in flight).
    slow = ~(done["delivery_lag_ms"] <= held_min_ms)
    lacking_at_end = slow & (done["undelivered_tokens_at_generation_end"] > 0)
    after = (held_ms > held_min_ms) & lacking_at_end
    during = (done["engine_send_blocked_max_ms"] > held_min_ms) & lacking_at_end
    held = done[after | during]
    lacking_at_free = done[slow & (done["undelivered_tokens_at_kv_free"] > 0)]
    spans = _held_spans(done, after, during, blocked_spans or {})
    usage = [_usage_over(steps, a, b) for a, b in spans]
    in_use = _in_use_peak(steps, spans)
    peak, peak_of = _held_peak(done, after, during, usage, kv_cache_blocks, in_use)
    victims = _victims(joined, spans)
    victim_wait_ms = (victims["t_engine_first_scheduled"] - victims["t_engine_arrival"]) * 1000.0
    status = "held" if len(held) else ("none" if len(lacking_at_free) else "not_observed")
    blocked_ms = done.loc[during, "engine_send_blocked_max_ms"]
    return {
        "status": status,
        "source": "engine_probe",
        "requests": len(done),
        "requests_held": len(held),
        "requests_held_after_generation": int(after.sum()),
        "requests_held_during_generation": int(during.sum()),
        "requests_undelivered_at_kv_free": len(lacking_at_free),
        "undelivered_bytes_at_kv_free": float(
            lacking_at_free["undelivered_bytes_at_kv_free"].sum()
        ),
        "kv_held_after_generation_max_ms": float(held_ms.max()) if len(held_ms) else None,
        "kv_held_after_generation_p50_ms": float(held_ms.median()) if len(held_ms) else None,
        "send_blocked_max_ms": float(blocked_ms.max()) if len(blocked_ms) else None,
        "held_min_ms": held_min_ms,
        "kv_held_s": float(sum(b - a for a, b in spans)),
        "kv_held_peak_perc": peak * 100.0,
        "kv_held_peak_of": peak_of,
        **_in_bytes(peak, kv_cache_blocks, kv_block_bytes),
        "kv_seconds": float(sum(s for _, s in usage)),
        "victims": len(victims),
        "victim_wait_max_ms": float(victim_wait_ms.max()) if len(victims) else None,
        "engine_requests_unjoined": unjoined,
    }


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.1f} kB"


def _binary(n: float) -> str:
    """``n`` bytes in GiB, MiB or KiB, as accelerator memory is counted: "1.5 GiB"."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n / 2**10:.1f} KiB"


def engine_verdict_line(v: dict[str, Any]) -> str:
    """One sentence for the per-request verdict, e.g. "none held: 24 of 24 requests freed KV
    within 3 ms of their last generated token; 16 of them still had 5.5 MB undelivered"; a
    held peak is given in bytes of accelerator memory too where the engine gave the size of its
    blocks ("peak KV 87.5 % = 1.7 MiB")."""
    head = "KV held by undelivered streams"
    n, held = v["requests"], v["requests_held"]
    lacking, nbytes = v["requests_undelivered_at_kv_free"], v["undelivered_bytes_at_kv_free"]
    if v["status"] == "held":
        during = v.get("requests_held_during_generation") or 0
        if during:  # a single-context engine: generation paused, the engine kept
            how = (
                f"kept the engine while their generation waited for delivery (up to "
                f"{v['send_blocked_max_ms']:.0f} ms in one pause"
            )
        else:
            how = (
                f"kept their KV after their last generated token while their output sat "
                f"undelivered (up to {v['kv_held_after_generation_max_ms']:.0f} ms"
            )
        queued = ""
        if v.get("victims"):
            queued = (
                f"; {v['victims']} request(s) queued behind them, up to "
                f"{v['victim_wait_max_ms']:.0f} ms"
            )
        held_bytes = v.get("kv_held_peak_bytes")
        size = "" if held_bytes is None else f" = {_binary(held_bytes)}"
        return (
            f"{head}: HELD: {held} of {n} requests {how}; {v['kv_held_s']:.1f} s in all, "
            f"peak KV {v['kv_held_peak_perc']:.1f} %{size}){queued}"
        )
    within = v["kv_held_after_generation_max_ms"]
    within = within or 0.0  # "within": rounded up, never below what was measured
    ms = f"{math.ceil(within * 10) / 10:.1f}" if within < 10 else f"{math.ceil(within):.0f}"
    freed = f"freed KV within {ms} ms of their last generated token" if n else ""
    if v["status"] == "none":
        return (
            f"{head}: none held: {n} of {n} requests {freed}; {lacking} of them still had "
            f"~{_mb(nbytes)} undelivered"
        )
    return (
        f"{head}: not observed (per request: {n} requests {freed}, none with output "
        "undelivered when its generation ended)"
    )


def probe_problem(probe: dict[str, Any] | None, engine_requests: pd.DataFrame) -> str | None:
    """Why the engine's tables cannot be used (``run.json``'s ``engine_probe`` and the
    request table), or ``None`` when they can."""
    if probe is None:
        return "the run recorded no engine probe (a run folder from before it existed)"
    if probe.get("status") != "running":
        return str(probe.get("reason") or f"engine probe status {probe.get('status')!r}")
    if not len(engine_requests):
        return "the engine probe recorded no request"
    return None


def combine_verdicts(
    engine: dict[str, Any] | None, scrapes: dict[str, Any], scrape_only_reason: str | None
) -> dict[str, Any]:
    """The KV-held verdict of the summary: from per-request evidence when the engine's tables
    exist (``engine``, with the scrape verdict beside it under ``scrapes`` and ``agreement``:
    ``agree``, ``disagree`` (one saw KV held, the other not; flagged in the line) or
    ``scrapes_not_observed``), else the scrape
    verdict marked ``scrape-only`` with ``scrape_only_reason``."""
    if engine is None:
        line = f"{scrapes['line']} [scrape-only: {scrape_only_reason}]"
        return {**scrapes, "source": "scrapes", "scrape_only_reason": scrape_only_reason,
                "line": line}  # fmt: skip
    line = engine_verdict_line(engine)
    if scrapes["status"] == "not_observed":
        agreement = "scrapes_not_observed"
    elif (scrapes["status"] == "held") == (engine["status"] == "held"):
        agreement = "agree"  # "none" beside "not_observed" too: neither saw KV held
    else:
        agreement = "disagree"
        line += f" [DISAGREES with the /metrics scrapes, which say {scrapes['status']}]"
    return {
        **engine,
        "undelivered_peak_bytes": scrapes["undelivered_peak_bytes"],
        "t_generation_end": scrapes["t_generation_end"],
        "window_s": scrapes["window_s"],
        "agreement": agreement,
        "scrapes": scrapes,
        "line": line,
    }
