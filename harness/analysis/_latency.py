"""Latency arithmetic: percentiles, per-token inter-token latency, inter-chunk latency.

Definitions (DESIGN.md vocabulary): TTFT is first-token time minus send time. A chunk that
carries ``k`` tokens after a gap ``Δt`` contributes ``k`` per-token ITL values of ``Δt / k``;
inter-chunk latency is the raw gap between token-carrying chunks. TPOT is the time from the
first to the last token divided by the tokens after the first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike


def percentile(values: ArrayLike, q: float) -> float | None:
    """The ``q``-th percentile (0..100, linear interpolation, numpy's default) of ``values``,
    or ``None`` when there are none. NaNs are ignored. Raises ``ValueError`` if ``q`` is outside
    0..100."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile q must be within 0..100, got {q}")
    arr = np.asarray(values, dtype=float)
    arr = arr[~np.isnan(arr)]
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def token_gaps(chunks: pd.DataFrame) -> pd.DataFrame:
    """The token-carrying rows of ``chunks`` (columns ``request_id``, ``t`` in s, ``tokens``;
    others are kept), sorted by stream and time, with a column ``gap_s``: the time since the
    same stream's previous token-carrying chunk (NaN for a stream's first). The one place the
    gaps behind ITL and inter-chunk latency are computed."""
    ch = chunks[chunks["tokens"] > 0].sort_values(["request_id", "t"])
    return ch.assign(gap_s=ch.groupby("request_id", sort=False)["t"].diff())


def per_token_itl_s(chunks: pd.DataFrame) -> np.ndarray:
    """Per-token inter-token latencies (s) of every stream in ``chunks`` (as
    :func:`token_gaps`): a chunk of ``k`` tokens after a gap ``Δt`` gives ``k`` values
    ``Δt / k``; a stream's first chunk gives none (its gap is the TTFT)."""
    ch = token_gaps(chunks)
    ch = ch[ch["gap_s"].notna()]
    tokens = ch["tokens"].to_numpy().astype(int)
    return np.repeat(ch["gap_s"].to_numpy() / tokens, tokens)


def inter_chunk_s(chunks: pd.DataFrame) -> np.ndarray:
    """Gaps (s) between consecutive token-carrying chunks of every stream in ``chunks``."""
    return token_gaps(chunks)["gap_s"].dropna().to_numpy()


def _stream(times_s: Sequence[float], tokens: Sequence[int]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": 0, "t": list(times_s), "tokens": list(tokens)})


def per_token_itl(times_s: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies (s) of one stream (:func:`per_token_itl_s`).

    ``times_s[i]`` is when token-carrying chunk ``i`` arrived and ``tokens[i]`` how many tokens
    it carried. Raises ``ValueError`` if the lengths differ or a count is below 1 (leave
    token-less chunks out).
    """
    if len(times_s) != len(tokens):
        raise ValueError("times_s and tokens must have the same length")
    for i, k in enumerate(tokens):
        if k < 1:
            raise ValueError(f"chunk {i} carries {k} tokens; leave token-less chunks out")
    return [float(v) for v in per_token_itl_s(_stream(times_s, tokens))]


def inter_chunk(times_s: Sequence[float]) -> list[float]:
    """Gaps (s) between consecutive token-carrying chunks of one stream (:func:`inter_chunk_s`)."""
    return [float(v) for v in inter_chunk_s(_stream(times_s, [1] * len(times_s)))]


def tpot(t_first_token_s: float, t_last_token_s: float, completion_tokens: int) -> float | None:
    """Time per output token after the first (s), ``None`` for streams of under 2 tokens."""
    if completion_tokens < 2:
        return None
    return (t_last_token_s - t_first_token_s) / (completion_tokens - 1)
