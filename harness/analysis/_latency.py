"""Latency arithmetic: percentiles, per-token inter-token latency, inter-chunk latency.

Definitions (DESIGN.md vocabulary): TTFT is first-token time minus send time. A chunk that
carries ``k`` tokens after a gap ``Δt`` contributes ``k`` per-token ITL values of ``Δt / k``;
inter-chunk latency is the raw gap between token-carrying chunks. TPOT is the time from the
first to the last token divided by the tokens after the first.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
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


def per_token_itl(times_s: Sequence[float], tokens: Sequence[int]) -> list[float]:
    """Per-token inter-token latencies (s) of one stream.

    ``times_s[i]`` is when token-carrying chunk ``i`` arrived and ``tokens[i]`` how many tokens
    it carried (chunks with 0 tokens must be left out by the caller). The first chunk yields no
    value (its gap is the TTFT); chunk ``i > 0`` yields ``tokens[i]`` values of
    ``(times_s[i] - times_s[i-1]) / tokens[i]``. Raises ``ValueError`` if the lengths differ or a
    count is below 1.
    """
    if len(times_s) != len(tokens):
        raise ValueError("times_s and tokens must have the same length")
    out: list[float] = []
    for i in range(1, len(times_s)):
        k = tokens[i]
        if k < 1:
            raise ValueError(f"chunk {i} carries {k} tokens; leave token-less chunks out")
        out.extend([(times_s[i] - times_s[i - 1]) / k] * k)
    return out


def inter_chunk(times_s: Sequence[float]) -> list[float]:
    """Gaps (s) between consecutive token-carrying chunks of one stream."""
    return [b - a for a, b in zip(times_s, times_s[1:], strict=False)]


def tpot(t_first_token_s: float, t_last_token_s: float, completion_tokens: int) -> float | None:
    """Time per output token after the first (s), ``None`` for streams of under 2 tokens."""
    if completion_tokens < 2:
        return None
    return (t_last_token_s - t_first_token_s) / (completion_tokens - 1)
