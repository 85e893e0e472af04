"""Change points in a figure's series, and the trend verdict of a history gate.

Change points come from Apache Otava (``otava.analysis.compute_change_points``: E-divisive
means split over sliding windows, then merged while a two-sided Student's t-test between the
segments on either side is not significant at ``max_pvalue``; Fleming et al., "Hunter: Using
Change Point Detection to Hunt for Performance Regressions", ICPE 2023). Each change point is
given with its size (the relative change of the mean from the segment before it to the one
after it), the interval of that size (Welch's, at ``confidence``) and Otava's p-value.

A history gate (``FIGURE ~ history within 10%``) fails when the newest runs lie after change
points that worsen the figure: the last change points of the series, as long as each worsens
it (with any between them that improve it by less than ``within``), taken together (from the
mean of the segment before the first of them to the mean of the newest segment) by more than
``within``, with a change whose interval (Welch's, at
``confidence``) lies wholly on the worse side, once the newest segment holds
:data:`MIN_AFTER` runs: Otava finds where the series changed, the interval says whether the
newest runs differ beyond noise.
Which way is worse follows from the figure's name (:func:`worse_direction`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_RUNS = 6  # fewer values than this: no change point is looked for
# Runs after a change point before a history gate may fail on it: one run alone cannot tell a
# step from an outlier (on a shared machine a single run 2x slower is common, bench/RESULTS.md).
MIN_AFTER = 2
MAX_PVALUE = 0.001  # Otava's default significance for a change point
WINDOW = 50  # Otava's default sliding window, in runs

_WORSE_WHEN_HIGHER = ("preemption", "saturated", "held", "cuts", "zombies", "failed", "errors",
                      "victims")  # fmt: skip


def worse_direction(figure: str) -> str:
    """Which way ``figure`` gets worse: ``lower`` for throughputs and completions (names
    ending ``_per_s``, holding ``goodput``, ``.outcome.complete``, ``.exercised``), ``higher``
    for latencies, durations, sizes, shares and failure counts (``_ms``, ``_s``, ``_bytes``,
    ``_perc``, preemptions, held KV, cuts, zombies, outcomes other than complete), else
    ``either`` (a change either way beyond the tolerance fails)."""
    last = figure.rsplit(".", 1)[-1]
    if (
        figure.endswith((".outcome.complete", ".exercised"))
        or last.endswith("_per_s")
        or ("goodput" in last)
    ):
        return "lower"
    if (
        ".outcome." in figure
        or last.endswith(("_ms", "_s", "_bytes", "_perc"))
        or any(w in last for w in _WORSE_WHEN_HIGHER)
    ):
        return "higher"
    return "either"


@dataclass(frozen=True)
class ChangePoint:
    """A change in a series: ``index`` is the first value of the new segment (0-based; run
    ``index + 1``); ``before``/``after`` the means of the segments either side; ``change`` the
    relative change ``after / before - 1`` with its interval ``low``..``high``; ``p_value``
    Otava's t-test p-value."""

    index: int
    before: float
    after: float
    change: float
    low: float
    high: float
    p_value: float

    def as_dict(self) -> dict[str, float | int]:
        return dict(vars(self))


def _welch(left: np.ndarray, right: np.ndarray, confidence: float) -> tuple[float, float]:
    """The interval of ``mean(right) / mean(left) - 1`` (Welch's interval of the difference of
    the means, over ``mean(left)``)."""
    m1, m2 = float(left.mean()), float(right.mean())
    v1 = left.var(ddof=1) / len(left) if len(left) > 1 else 0.0
    v2 = right.var(ddof=1) / len(right) if len(right) > 1 else 0.0
    se = math.sqrt(v1 + v2)
    if se == 0 or m1 == 0:
        change = (m2 / m1 - 1) if m1 else math.nan
        return change, change
    df = (v1 + v2) ** 2 / sum(v**2 / (len(x) - 1) for v, x in ((v1, left), (v2, right))
                              if len(x) > 1 and v > 0)  # fmt: skip
    t = float(stats.t.ppf(0.5 + confidence / 2, df))
    d = m2 - m1
    return (d - t * se) / abs(m1), (d + t * se) / abs(m1)


def change_points(
    values: Sequence[float],
    *,
    max_pvalue: float = MAX_PVALUE,
    window: int = WINDOW,
    confidence: float = 0.95,
) -> list[ChangePoint]:
    """The change points of ``values`` (oldest first) by Otava (module docstring), in order.
    Fewer than :data:`MIN_RUNS` values: none."""
    from otava.analysis import compute_change_points

    series = np.asarray(values, dtype=float)
    if len(series) < MIN_RUNS:
        return []
    # A list: given an array, Otava 0.8 raises on some series (an empty segment).
    found, _ = compute_change_points(series.tolist(), window_len=window, max_pvalue=max_pvalue)
    bounds = [0, *(int(c.index) for c in found), len(series)]
    out = []
    for i, cp in enumerate(found):
        left, right = series[bounds[i] : bounds[i + 1]], series[bounds[i + 1] : bounds[i + 2]]
        low, high = _welch(left, right, confidence)
        before, after = float(left.mean()), float(right.mean())
        change = after / before - 1 if before else math.nan
        out.append(ChangePoint(int(cp.index), before, after, change, low, high,
                               float(cp.stats.pvalue)))  # fmt: skip
    return out


def _worsens(change: float, direction: str) -> bool:
    if direction == "higher":
        return change > 0
    if direction == "lower":
        return change < 0
    return change != 0


@dataclass(frozen=True)
class Trend:
    """A history gate's verdict on a series: ``failed``, ``reason`` (one line: the change
    points, their sizes, intervals and p-values, and the total change against ``within``),
    ``change`` (the newest segment's mean against the reference's, relative; ``None`` without
    a worsening change point) and every change point of the series."""

    failed: bool
    reason: str
    change: float | None
    points: list[ChangePoint]


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def judge_trend(
    values: Sequence[float],
    figure: str,
    *,
    within: float,
    max_pvalue: float = MAX_PVALUE,
    confidence: float = 0.95,
) -> Trend:
    """The trend verdict on ``values`` (``figure`` over its series' runs, oldest first, the
    run being judged last): module docstring."""
    n = len(values)
    if n < MIN_RUNS:
        return Trend(False, f"{n} run(s) in its history: a change point needs at least "
                     f"{MIN_RUNS}", None, [])  # fmt: skip
    points = change_points(values, max_pvalue=max_pvalue, confidence=confidence)
    direction = worse_direction(figure)
    # The trailing change points that worsen the figure, and any between them that improve it
    # by less than the tolerance (a regression followed by a small recovery is still one).
    chain: list[ChangePoint] = []
    for cp in reversed(points):
        if not _worsens(cp.change, direction) and abs(cp.change) > within:
            break
        chain.insert(0, cp)
    while chain and not _worsens(chain[0].change, direction):
        chain.pop(0)
    described = "; ".join(
        f"run {cp.index + 1}: {_pct(cp.change)} [{_pct(cp.low)}, {_pct(cp.high)}], "
        f"p = {cp.p_value:.2g}"
        for cp in (chain or points[-1:])
    )
    if not chain:
        why = f"the last change point improves it ({described})" if points else "no change point"
        return Trend(False, f"{why} in {n} runs (worse when {direction})", None, points)
    series = np.asarray(values, dtype=float)
    first = points.index(chain[0])
    start = points[first - 1].index if first else 0
    before, now = series[start : chain[0].index], series[chain[-1].index :]
    reference, newest = float(before.mean()), float(now.mean())
    change = newest / reference - 1 if reference else math.inf
    low, high = _welch(before, now, confidence)
    beyond = abs(change) > within
    clear = _worsens(low, direction) and _worsens(high, direction)  # the interval excludes 0
    failed = beyond and clear and len(now) >= MIN_AFTER
    verdict = f"{'beyond' if beyond else 'within'} {within:.0%}"
    if beyond and not failed:
        verdict += (
            f", but {len(now)} run after it: the next one tells a step from an outlier"
            if len(now) < MIN_AFTER
            else ", but its interval holds no change: noise, not a step"
        )
    reason = (
        f"{len(now)} newest run(s) after change point(s) at {described}; mean {newest:.6g} "
        f"against {reference:.6g} before: {_pct(change)} [{_pct(low)}, {_pct(high)}], "
        f"{verdict} (worse when {direction}; {n} runs)"
    )
    return Trend(failed, reason, change, points)
