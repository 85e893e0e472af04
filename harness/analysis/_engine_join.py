"""The engine's own records joined with what each client received.

The engine (vLLM through the probe, the emulator) writes ``engine_requests.parquet`` and
``engine_steps.parquet`` (``harness._engine_probe``). Each engine request is joined with the
client record whose stream it served: vLLM's engine request id begins with the stream's ``id``
(``cmpl-<X-Request-Id>``) followed by ``-<choice>-<suffix>`` (vllm/entrypoints/openai/
completion/serving.py; the suffix is added by the engine client). Times on both sides are
CLOCK_MONOTONIC seconds of the same machine, or, for a worker on another clock, its records
moved onto the harness's (``loadgen._clock``) within ``clock_bound_ms``: a figure that compares
such a client's time with the engine's is not drawn where the bound leaves it undecided
(:func:`beyond_clock_bound`, and undelivered tokens that the bound could change).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

_ENGINE_OWN = [
    "engine_request_id", "t_engine_arrival", "t_engine_first_scheduled", "t_engine_first_token",
    "t_generation_end", "t_kv_freed", "engine_finish_reason", "engine_preemptions",
    "engine_kv_blocks_freed", "engine_output_tokens", "engine_send_blocked_max_ms",
    "engine_prompt_tokens", "prompt_cached_tokens",
]  # fmt: skip
ENGINE_JOIN_COLUMNS = [
    *_ENGINE_OWN, "delivery_lag_ms", "kv_held_after_generation_ms",
    "undelivered_tokens_at_generation_end", "undelivered_tokens_at_kv_free",
    "undelivered_bytes_at_generation_end", "undelivered_bytes_at_kv_free",
]  # fmt: skip
_RENAMED = {
    "prompt_tokens": "engine_prompt_tokens",
    "t_arrival": "t_engine_arrival",
    "t_first_scheduled": "t_engine_first_scheduled",
    "t_first_token": "t_engine_first_token",
    "finish_reason": "engine_finish_reason",
    "kv_blocks_freed": "engine_kv_blocks_freed",
    "output_tokens": "engine_output_tokens",
}


VLLM_ID_PREFIXES = ("cmpl-", "chatcmpl-")
"""vLLM names a request ``cmpl-<X-Request-Id>`` (``chatcmpl-`` for chat;
``vllm/entrypoints/openai/completion/serving.py``), and the client sends its record's
``request_id`` as ``X-Request-Id``: the join of a request whose client left before any chunk
(so without a stream id)."""


def stream_of(engine_id: str, stream_ids: set[str]) -> str | None:
    """The stream id in ``stream_ids`` that ``engine_id`` begins with, followed by ``-`` or
    nothing (the longest, if several); ``None`` if none does."""
    candidate = engine_id
    while True:
        if candidate in stream_ids:
            return candidate
        if "-" not in candidate:
            return None
        candidate = candidate.rsplit("-", 1)[0]


def received_by(chunks: pd.DataFrame, moments: pd.Series) -> tuple[pd.Series, pd.Series]:
    """Per request (the index of ``moments``, request ids): tokens and bytes of its chunks
    that arrived at or before its moment (monotonic s)."""
    if not len(chunks) or not len(moments):
        empty = pd.Series(0.0, index=moments.index)
        return empty, empty.copy()
    c = chunks[["request_id", "t", "tokens", "bytes"]].copy()
    c["moment"] = c["request_id"].map(moments)
    c = c[c["moment"].notna() & (c["t"] <= c["moment"])]
    got = c.groupby("request_id")[["tokens", "bytes"]].sum()
    got = got.reindex(moments.index).fillna(0.0)
    return got["tokens"], got["bytes"]


def beyond_clock_bound(ms: pd.Series, bound_ms: pd.Series) -> pd.Series:
    """``ms`` (a difference between a client's time and the engine's, per request) where its
    size exceeds the request's clock bound (``clock_bound_ms``, NaN on the harness's clock),
    NaN where it does not: such a difference says nothing the clocks can tell apart."""
    undecided = bound_ms.notna() & (ms.abs() <= bound_ms)
    return ms.where(~undecided)


def join_engine(
    requests: pd.DataFrame, chunks: pd.DataFrame, engine: pd.DataFrame
) -> tuple[pd.DataFrame, int]:
    """``requests`` with the :data:`ENGINE_JOIN_COLUMNS` of its engine request (NaN where none
    joined), and how many engine requests joined no client record (the harness's own warm-up,
    other clients of a shared engine).

    Delivery lag (ms) is the client's last byte minus the engine's generation end, for a
    client that received the whole stream (NaN for one that never did); KV held after
    generation (ms) is KV freed minus generation end. Undelivered tokens at a moment are
    the engine's generated tokens minus the tokens of the chunks the client had received by
    then; undelivered bytes are those tokens times the stream's mean wire bytes per token (an
    estimate: the client never sees the bytes it never reads).
    """
    out = requests.copy()
    for col in ENGINE_JOIN_COLUMNS:
        out[col] = np.nan
    out["engine_request_id"] = out["engine_request_id"].astype(object)
    out["engine_finish_reason"] = out["engine_finish_reason"].astype(object)
    if not len(engine) or "stream_id" not in out or not len(out):
        return out, len(engine)
    by_stream: dict[str, str] = {}
    for s, rid in zip(out["stream_id"], out["request_id"], strict=True):
        if isinstance(s, str):
            by_stream[s] = rid
        else:  # no chunk came: the id vLLM derives from the client's X-Request-Id header
            by_stream.update({f"{p}{rid}": rid for p in VLLM_ID_PREFIXES})
    streams = set(by_stream)
    eng = engine.copy()
    eng["request_id"] = [
        by_stream.get(stream_of(e, streams) or "") for e in eng["engine_request_id"]
    ]
    unjoined = int(eng["request_id"].isna().sum())
    eng = eng[eng["request_id"].notna()].drop_duplicates("request_id", keep="last")
    eng = eng.rename(columns=_RENAMED).set_index("request_id")
    eng["engine_preemptions"] = eng["preempted_at"].map(lambda v: 0 if v is None else len(v))
    if "send_blocked_at" in eng:
        eng["engine_send_blocked_max_ms"] = [
            max((b - a for a, b in spans), default=0.0) * 1000.0
            for spans in map(_spans, eng["send_blocked_at"], eng["send_unblocked_at"])
        ]
    idx = out["request_id"]
    for col in _ENGINE_OWN:  # the rest are derived below
        out[col] = idx.map(eng[col]).to_numpy() if col in eng else np.nan
    gen_end, freed = (
        out.set_index("request_id")["t_generation_end"],
        out.set_index("request_id")["t_kv_freed"],
    )
    complete = out["outcome"] == "complete"
    lag = (out["t_last_byte"] - out["t_generation_end"]) * 1000.0
    bound_ms = out["clock_bound_ms"] if "clock_bound_ms" in out else pd.Series(np.nan, out.index)
    out["delivery_lag_ms"] = beyond_clock_bound(lag.where(complete), bound_ms)
    out["kv_held_after_generation_ms"] = (out["t_kv_freed"] - out["t_generation_end"]) * 1000.0
    generated = out["engine_output_tokens"].astype(float).to_numpy()
    tokens = chunks.groupby("request_id")["tokens"].sum() if len(chunks) else pd.Series(dtype=float)
    wire = chunks.groupby("request_id")["bytes"].sum() if len(chunks) else pd.Series(dtype=float)
    per_token = (wire / tokens.replace(0, np.nan)).reindex(idx).to_numpy()
    fallback = float(wire.sum() / tokens.sum()) if len(tokens) and tokens.sum() else np.nan
    per_token = np.where(np.isnan(per_token), fallback, per_token).reshape(-1)
    bound_s = bound_ms.fillna(0.0).to_numpy() / 1000.0
    for moment, name in ((gen_end, "generation_end"), (freed, "kv_free")):
        received = _received(chunks, moment, idx, 0.0)
        if bound_s.any():  # a count the clocks' bound could change is not drawn
            early = _received(chunks, moment, idx, -bound_s)
            late = _received(chunks, moment, idx, bound_s)
            received = np.where(early == late, received, np.nan)
        undelivered = np.clip(generated - received, 0, None)
        out[f"undelivered_tokens_at_{name}"] = undelivered
        out[f"undelivered_bytes_at_{name}"] = undelivered * per_token
    return out, unjoined


def _received(chunks: pd.DataFrame, moments: pd.Series, idx: pd.Series, shift_s: Any) -> Any:
    """Tokens each request of ``idx`` had received by its moment plus ``shift_s`` (s, a
    number or one per request), as an array in the order of ``idx``."""
    at = moments.reindex(idx).to_numpy() + shift_s
    shifted = pd.Series(at, index=idx.to_numpy()).dropna()
    shifted = shifted[~shifted.index.duplicated()]
    got_tokens, _ = received_by(chunks, shifted)
    return got_tokens.reindex(idx).to_numpy()


def _spans(starts: Any, ends: Any) -> list[tuple[float, float]]:
    """Pairs of two list cells (null: none)."""
    if starts is None or ends is None:
        return []
    return [(float(a), float(b)) for a, b in zip(starts, ends, strict=False)]


def send_blocked_spans(engine: pd.DataFrame, min_ms: float) -> dict[str, list[tuple[float, float]]]:
    """Per engine request id, the spans (monotonic s) of at least ``min_ms`` in which its
    generation waited for the server's send path while it kept the engine (the columns
    ``send_blocked_at`` / ``send_unblocked_at`` of ``engine_requests.parquet``; engines that
    never wait leave them empty or lack them)."""
    if "send_blocked_at" not in engine:
        return {}
    out: dict[str, list[tuple[float, float]]] = {}
    rows = zip(
        engine["engine_request_id"], engine["send_blocked_at"], engine["send_unblocked_at"],
        strict=True,
    )  # fmt: skip
    for eid, starts, ends in rows:
        spans = [(a, b) for a, b in _spans(starts, ends) if (b - a) * 1000.0 >= min_ms]
        if spans:
            out[str(eid)] = spans
    return out


def engine_aborts(joined: pd.DataFrame) -> pd.DataFrame:
    """``joined`` with ``t_engine_abort`` and ``stall_to_abort_ms`` taken from the engine's own
    records (the generation end of each request it finished as ``abort``), replacing the
    estimate from the scraped counters (``_stalls.attribute_aborts``)."""
    out = joined.copy()
    aborted = out["engine_finish_reason"] == "abort"
    out["t_engine_abort"] = out["t_generation_end"].where(aborted).astype(float)
    out["stall_to_abort_ms"] = (out["t_engine_abort"] - out["t_stall"]) * 1000.0
    return out
