"""What stalled streams cost the engine: when it aborted them, and the decode nobody received.

**Engine aborts.** Neither vLLM nor the emulator says *which* request it aborted when. vLLM
0.32 does not even count requests aborted because their client went away in
``vllm:request_success_total{finished_reason="abort"}`` (``OutputProcessor.abort_requests``
in ``vllm/v1/engine/output_processor.py`` skips the finished-request statistics), so aborts
are counted by conservation instead, the same way for every engine: at each scrape,

    aborted(t) = sent(t) - finished(t) - (running(t) + waiting(t))

where ``sent`` counts the requests the clients had sent (from the records), ``finished`` is
the rise of ``request_success_total`` over every reason but ``abort``, and
``running``/``waiting`` are the engine's gauges. A scrape is stamped when it is sent and its
figures may be a little younger, so ``sent`` is counted twice: up to the scrape's stamp (errs
low: the answer may count requests sent after the stamp) and up to the next scrape (errs high:
requests sent but not yet queued). Aborts never decrease, so the count at each scrape is the
smallest high count of it and all later scrapes, at most that scrape's low count, and at least
the count of any earlier scrape. Each rise is an abort, dated at the scrape that first showed
it (the true moment lies up to one scrape interval earlier).
Aborts are then matched to the streams that did not complete, in order: the stream that gave
up first (its client stalled, or it ended) is taken to be aborted first, never before it gave
up. ``t_engine_abort`` and ``stall_to_abort_ms`` (from the stream's first stall) are that
estimate; a stream left without an abort gets NaN.

**Wasted decode.** ``undelivered_tokens`` is the rise of the engine's
``vllm:generation_tokens_total`` over the run minus the output tokens all clients received
(their ``usage.completion_tokens``): the output tokens the engine generated that no client
read. For streams whose reader stalled this is the decode done after the stall began, plus the
tokens already generated but still in flight (server, proxy and socket buffers) when it began;
the latter is bounded by those buffers, a few KiB to the proxy's buffer size per stream. It is
exact when the counter covers only this run's requests (one run at a time on the target).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ABORT_COLUMNS = ["t_engine_abort", "stall_to_abort_ms"]


def abort_times(metrics: pd.DataFrame, t_send: pd.Series) -> list[float]:
    """Monotonic times (s) of the scrapes that first showed each engine abort (one entry per
    abort, so a time repeats when one scrape showed several), by conservation (module
    docstring). ``metrics`` needs ``t``, ``scrape_ok``, ``num_requests_running``,
    ``num_requests_waiting`` and ``request_success_<reason>`` columns; ``t_send`` holds the
    requests' send times. Returns ``[]`` when a needed column is missing."""
    needed = {"t", "scrape_ok", "num_requests_running", "num_requests_waiting"}
    if metrics.empty or not needed <= set(metrics.columns):
        return []
    m = metrics[metrics["scrape_ok"].astype(bool)].sort_values("t")
    m = m.dropna(subset=["num_requests_running", "num_requests_waiting"])
    if m.empty:
        return []
    reasons = [
        c for c in m.columns if c.startswith("request_success_") and c != "request_success_abort"
    ]
    finished = m[reasons].ffill().fillna(0.0).sum(axis=1) if reasons else pd.Series(0.0, m.index)
    finished = finished - finished.iloc[0]
    sends = np.sort(t_send.dropna().to_numpy(dtype=float))
    t = m["t"].to_numpy(dtype=float)
    queued = (m["num_requests_running"] + m["num_requests_waiting"]).to_numpy(dtype=float)
    done = finished.to_numpy(dtype=float)
    # Requests of someone else in the engine at the first scrape.
    baseline = queued[0] - np.searchsorted(sends, t[0], side="right")
    # Counting requests sent by the scrape's stamp can only err low (a late answer counts
    # requests sent after it); counting those sent before the next scrape only high.
    low = np.searchsorted(sends, t, side="right") - done - (queued - baseline)
    high = (
        np.searchsorted(sends, np.append(t[1:], np.inf), side="right") - done - (queued - baseline)
    )
    upper = np.minimum.accumulate(high[::-1])[::-1]  # aborts never decrease: min over later
    aborted = np.maximum.accumulate(np.minimum(upper, low))
    aborted = np.maximum(np.round(aborted), 0.0)
    rises = np.diff(np.concatenate(([0.0], aborted)))
    return [float(when) for when, n in zip(t, rises, strict=True) for _ in range(int(n))]


def attribute_aborts(requests: pd.DataFrame, aborts: list[float]) -> pd.DataFrame:
    """``requests`` (a ``requests_frame``) with :data:`ABORT_COLUMNS` added: each abort time,
    in order, goes to the not-yet-matched stream that did not complete and gave up earliest
    (``t_stall`` if its client stalled, else ``t_end``) no later than the abort. Times in
    monotonic s, ``stall_to_abort_ms`` in ms (NaN without a stall or an abort)."""
    out = requests.copy()
    out["t_engine_abort"] = np.nan
    out["stall_to_abort_ms"] = np.nan
    if out.empty or not aborts:
        return out
    gave_up = out["t_stall"].where(out["t_stall"].notna(), out["t_end"])
    candidates = gave_up[(out["outcome"] != "complete") & gave_up.notna()].sort_values()
    pending = list(candidates.items())
    for t_abort in sorted(aborts):
        for i, (index, t_gave_up) in enumerate(pending):
            if t_gave_up <= t_abort:
                out.loc[index, "t_engine_abort"] = t_abort
                del pending[i]
                break
    out["stall_to_abort_ms"] = (out["t_engine_abort"] - out["t_stall"]) * 1000.0
    return out


def generation_tokens(metrics: pd.DataFrame) -> float | None:
    """The rise of ``generation_tokens_total`` over the scrapes (tokens), or ``None`` if the
    server does not report it."""
    if "generation_tokens_total" not in metrics or metrics.empty:
        return None
    ok = metrics[metrics["scrape_ok"].astype(bool)]["generation_tokens_total"].dropna()
    return float(ok.iloc[-1] - ok.iloc[0]) if len(ok) else None


def undelivered_tokens(metrics: pd.DataFrame, requests: pd.DataFrame) -> float | None:
    """Output tokens the engine generated that no client received (module docstring): the
    counter's rise minus the sum of ``completion_tokens``, at least 0; ``None`` without the
    counter."""
    generated = generation_tokens(metrics)
    if generated is None:
        return None
    received = float(requests["completion_tokens"].sum()) if len(requests) else 0.0
    return max(0.0, generated - received)
