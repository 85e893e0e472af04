"""Figures with uncertainty: what several repeats of one workload measured, with 95 % intervals,
and how a candidate differs from a baseline.

:class:`Evidence` holds each repeat's figures (:func:`harness.runfolder.figures`) and the
per-request samples behind the latency figures (:func:`run_samples`: one row per value, with
its repeat and request). Two kinds of interval, chosen per figure:

- a latency figure that is one statistic of a group's requests (``fast.ttft_p99_ms``:
  :data:`harness.runfolder.SAMPLE_FIGURES`) is estimated on the **pooled** requests of every
  repeat, and its interval is a **hierarchical bootstrap**: each draw picks the repeats with
  replacement, then each picked repeat's requests with replacement, and takes the statistic of
  the pooled draw (a request's ITL values travel with it). It carries both the spread between
  repeats and the sampling noise within one run, so it exists for a single run too (Davison &
  Hinkley, *Bootstrap Methods*, 1997, §3.8, resampling at both stages). The percentile of a
  draw is the weighted inverted-CDF percentile (numpy ``method="inverted_cdf"``).
- any other figure (server, proxy and run figures, counts, rates) is the **mean of the
  repeats**, with a Student-t interval over the per-repeat values (``mean ± t(R-1) s/√R``);
  its draws are that t distribution's, so that a comparison can combine them with the other
  side's. One repeat gives no interval: the figure is compared as it is.

A comparison of candidate and baseline (:func:`compare_figure`) draws both sides
independently: the ratio of the candidate's draws to the baseline's gives the effect's
interval; the p-value is the two-sided Mann-Whitney U test of the pooled samples
(``scipy.stats.mannwhitneyu``) for a latency figure, Welch's t-test of the per-repeat values
for others (needs two repeats on each side). Pooled requests of several repeats are not
independent, so the U test's p-value is optimistic where repeats differ; the bootstrap
interval is not, and it is what the gates decide on.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from pydantic import ValidationError

from harness.analysis._latency import token_gaps
from harness.runfolder import (
    CHUNKS,
    IMPACT_DIFFERENCES,
    IMPACT_FIGURES,
    REQUESTS,
    SUMMARY_JSON,
    RunSummary,
    figures,
    impact_name,
    read_parquet,
    sample_of,
)
from loadgen import turn_part
from zwcore import RunFolderError

SAMPLE_COLUMNS = ["repeat", "request", "sample", "value"]
_REQUEST_KINDS = (
    "ttft_ms", "tpot_ms", "e2e_ms", "send_lag_ms", "ttft_from_scheduled_ms",
    "e2e_from_scheduled_ms",
)  # fmt: skip
Method = Literal["bootstrap", "t", "single", "none"]


def empty_samples() -> pd.DataFrame:
    """A samples frame with no rows (:data:`SAMPLE_COLUMNS`)."""
    return pd.DataFrame(
        {
            "repeat": pd.Series(dtype="int64"),
            "request": pd.Series(dtype="int64"),
            "sample": pd.Series(dtype=object),
            "value": pd.Series(dtype=float),
        }
    )


def run_samples(requests: pd.DataFrame, chunks: pd.DataFrame, *, repeat: int = 0) -> pd.DataFrame:
    """The per-request samples of one run (its ``requests.parquet`` and ``chunks.parquet``
    frames): one row per value, columns :data:`SAMPLE_COLUMNS`, ``sample`` named
    ``<group>.<kind>`` (and ``<group>.<behaviour>.<kind>`` for a client mix's behaviours,
    ``<group>.turn1.<kind>`` and ``<group>.later_turns.<kind>`` for a session's turns), ms.
    ``request`` numbers the run's requests; ITL gives one value per token, inter-chunk latency
    one per gap (as :mod:`harness.analysis._latency` defines them)."""
    if not len(requests):
        return empty_samples()
    ids = {rid: i for i, rid in enumerate(requests["request_id"])}
    owners = [requests["group"].astype(str)]
    if "behaviour" in requests and requests["behaviour"].notna().any():
        owners.append(requests["group"].astype(str) + "." + requests["behaviour"].astype(str))
    if "turn" in requests and requests["turn"].notna().any():
        turns = requests["turn"].map(lambda t: None if pd.isna(t) else turn_part(int(t)))
        owners.append(requests["group"].astype(str) + "." + turns.astype(str))
    frames = []
    for owner in owners:
        keep = owner.notna() & ~owner.str.endswith(".None") & ~owner.str.endswith(".nan")
        req = requests[keep]
        for kind in _REQUEST_KINDS:
            if kind in req:
                part = req[["request_id", kind]].dropna()
                frames.append(
                    _frame(part["request_id"], owner[part.index] + f".{kind}", part[kind])
                )
        by_id = dict(zip(req["request_id"], owner[req.index], strict=True))
        gaps = token_gaps(chunks[chunks["request_id"].isin(by_id)])
        gaps = gaps[gaps["gap_s"].notna()]
        if len(gaps):
            who = gaps["request_id"].map(by_id)
            frames.append(_frame(gaps["request_id"], who + ".inter_chunk_ms", gaps["gap_s"] * 1e3))
            tokens = gaps["tokens"].to_numpy().astype(int)
            per_token = np.repeat(gaps["gap_s"].to_numpy() * 1e3 / tokens, tokens)
            frames.append(
                _frame(
                    pd.Series(np.repeat(gaps["request_id"].to_numpy(), tokens)),
                    pd.Series(np.repeat((who + ".itl_ms").to_numpy(), tokens)),
                    pd.Series(per_token),
                )
            )
    if not frames:
        return empty_samples()
    out = pd.concat(frames, ignore_index=True)
    out["request"] = out["request"].map(ids).astype("int64")
    out.insert(0, "repeat", repeat)
    return out[SAMPLE_COLUMNS]


def _frame(request_ids: pd.Series, sample: pd.Series, value: pd.Series) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request": np.asarray(request_ids),
            "sample": np.asarray(sample, dtype=object),
            "value": np.asarray(value, dtype=float),
        }
    )


@dataclass(frozen=True)
class Evidence:
    """What one or more repeats of a workload measured: ``figures`` per repeat (in order) and
    the per-request ``samples`` of all of them (:data:`SAMPLE_COLUMNS`; ``repeat`` indexes
    ``figures``). A baseline saved before it kept samples has none (an empty frame)."""

    figures: Sequence[Mapping[str, float | None]]
    samples: pd.DataFrame = field(default_factory=empty_samples)

    @property
    def repeats(self) -> int:
        return len(self.figures)

    def values(self, figure: str) -> list[float | None]:
        """``figure`` of each repeat (``None`` where that repeat did not measure it)."""
        return [f.get(figure) for f in self.figures]

    def sample(self, name: str) -> pd.DataFrame:
        """The rows of sample ``name`` (``fast.ttft_ms``)."""
        return self.samples[self.samples["sample"] == name]


def evidence_of(run_dirs: Sequence[Path]) -> Evidence:
    """The :class:`Evidence` of run folders (repeats of one workload, in order): each one's
    figures (its ``summary.json``) and samples (its ``requests.parquet`` and
    ``chunks.parquet``). Raises :class:`~zwcore.RunFolderError` naming a folder whose summary
    is missing or invalid."""
    per_repeat, frames = [], []
    for i, run_dir in enumerate(run_dirs):
        path = run_dir / SUMMARY_JSON
        try:
            summary = RunSummary.model_validate_json(path.read_bytes())
        except OSError as exc:
            raise RunFolderError(f"{path}: cannot read the run's summary: {exc}") from None
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            raise RunFolderError(
                f"{path}: {where}: {err['msg']} (written by an older zerowindow?)"
            ) from None
        per_repeat.append(figures(summary))
        requests, chunks = read_parquet(run_dir / REQUESTS), read_parquet(run_dir / CHUNKS)
        if len(requests) and len(chunks.columns):
            frames.append(run_samples(requests, chunks, repeat=i))
    samples = pd.concat(frames, ignore_index=True) if frames else empty_samples()
    return Evidence(per_repeat, samples)


def pooled_figures(evidence: Evidence) -> dict[str, float | None]:
    """Every figure any repeat measured, estimated over all of them (:func:`point`)."""
    names = sorted({name for f in evidence.figures for name in f})
    return {name: point(evidence, name)[0] for name in names}


@dataclass(frozen=True)
class Estimate:
    """A figure over the repeats: ``value`` (pooled statistic, or mean of the repeats),
    ``low``/``high`` its interval at ``confidence`` (``None`` without one), each repeat's
    value, and the ``method``: ``bootstrap`` (hierarchical, over repeats and requests), ``t``
    (Student-t over the repeats), ``single`` (one value, no interval) or ``none`` (not
    measured)."""

    figure: str
    value: float | None
    low: float | None
    high: float | None
    per_repeat: list[float | None]
    method: Method
    confidence: float

    def as_dict(self) -> dict[str, object]:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "per_repeat": self.per_repeat,
            "method": self.method,
        }


def _statistic(values: np.ndarray, stat: float | str) -> float:
    return float(values.mean() if stat == "mean" else np.percentile(values, float(stat)))


def _bootstrap(
    rows: pd.DataFrame, stat: float | str, n: int, rng: np.random.Generator, block: int = 64
) -> np.ndarray:
    """``n`` hierarchical bootstrap draws of ``stat`` over ``rows`` (one sample's rows): per
    draw, the repeats are picked with replacement, then each picked repeat's requests (a
    repeat picked ``k`` times gives ``k`` times its count of request picks); a value weighs
    what its request was picked. Computed ``block`` draws at a time."""
    order = np.argsort(rows["value"].to_numpy(), kind="stable")
    values = rows["value"].to_numpy()[order]
    keys = rows["repeat"].to_numpy().astype(np.int64) * (1 << 32) + rows["request"].to_numpy()
    uniq, owner = np.unique(keys[order], return_inverse=True)
    repeat_of = uniq >> 32
    members = [np.flatnonzero(repeat_of == r) for r in np.unique(repeat_of)]
    picks = rng.multinomial(len(members), np.full(len(members), 1 / len(members)), size=n)
    out = np.empty(n)
    for start in range(0, n, block):
        stop = min(n, start + block)
        weights = np.zeros((stop - start, len(uniq)))
        for j, m in enumerate(members):
            weights[:, m] = rng.multinomial(
                picks[start:stop, j] * len(m), np.full(len(m), 1 / len(m))
            )
        w = weights[:, owner]
        if stat == "mean":
            out[start:stop] = (w @ values) / w.sum(axis=1)
        else:
            cum = np.cumsum(w, axis=1)
            target = float(stat) / 100.0 * cum[:, -1]
            k = (cum < target[:, None]).sum(axis=1)
            out[start:stop] = values[np.minimum(k, len(values) - 1)]
    return out


def _t_draws(values: list[float], n: int, rng: np.random.Generator) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return np.full(n, float(arr[0]))
    scale = arr.std(ddof=1) / math.sqrt(arr.size)
    return arr.mean() + scale * rng.standard_t(arr.size - 1, n)


def draws(
    evidence: Evidence, figure: str, *, n: int, rng: np.random.Generator
) -> np.ndarray | None:
    """``n`` draws of ``figure``'s sampling distribution (module docstring), or ``None`` when no
    repeat measured it."""
    if (behind := sample_of(figure)) is not None and len(rows := evidence.sample(behind[0])):
        return _bootstrap(rows, behind[1], n, rng)
    measured = [v for v in evidence.values(figure) if v is not None]
    return _t_draws(measured, n, rng) if measured else None


def point(evidence: Evidence, figure: str) -> tuple[float | None, Method]:
    """``figure``'s estimate over the repeats, and the method its interval takes (module
    docstring): the statistic of the pooled requests, else the mean of the repeats."""
    behind = sample_of(figure)
    if behind is not None and len(rows := evidence.sample(behind[0])):
        return _statistic(rows["value"].to_numpy(), behind[1]), "bootstrap"
    measured = [v for v in evidence.values(figure) if v is not None]
    if not measured:
        return None, "none"
    return float(np.mean(measured)), "t" if len(measured) > 1 else "single"


def estimate(
    evidence: Evidence,
    figure: str,
    *,
    confidence: float = 0.95,
    n: int = 1000,
    seed: int = 0,
) -> Estimate:
    """``figure`` over the repeats of ``evidence``, with its interval (module docstring)."""
    per_repeat = evidence.values(figure)
    value, method = point(evidence, figure)
    low = high = None
    if method in ("bootstrap", "t"):
        sample = draws(evidence, figure, n=n, rng=np.random.default_rng(seed))
        assert sample is not None
        low, high = interval(sample, confidence)
    return Estimate(figure, value, low, high, per_repeat, method, confidence)


def interval(sample: np.ndarray, confidence: float) -> tuple[float, float]:
    """The central ``confidence`` interval of ``sample`` (percentile method)."""
    tail = (1.0 - confidence) / 2.0 * 100.0
    lo, hi = np.percentile(sample, [tail, 100.0 - tail])
    return float(lo), float(hi)


@dataclass(frozen=True)
class Difference:
    """Candidate against baseline for one figure: the ``ratio`` of their estimates and its
    interval (from independent draws of both sides), and the ``p_value`` of the test named
    ``test`` (``mann-whitney-u``, ``welch-t``; ``None`` where neither applies)."""

    ratio: float | None
    ratio_low: float | None
    ratio_high: float | None
    p_value: float | None
    test: str | None


def p_value(
    candidate: Evidence, baseline: Evidence, figure: str
) -> tuple[float | None, str | None]:
    """The two-sided p-value that ``figure`` (a figure, or a sample name such as
    ``fast.ttft_ms``) is the same in both, and the test used (module docstring)."""
    from scipy import stats  # on first use: it takes half a second to import

    name = behind[0] if (behind := sample_of(figure)) else figure
    a, b = candidate.sample(name)["value"], baseline.sample(name)["value"]
    if len(a) and len(b):
        return float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue), "mann-whitney-u"
    va = [v for v in candidate.values(figure) if v is not None]
    vb = [v for v in baseline.values(figure) if v is not None]
    if len(va) > 1 and len(vb) > 1 and (np.std(va) > 0 or np.std(vb) > 0):
        with warnings.catch_warnings():  # near-identical values: scipy warns of precision loss
            warnings.simplefilter("ignore", RuntimeWarning)
            return float(stats.ttest_ind(va, vb, equal_var=False).pvalue), "welch-t"
    return None, None


def ratio_draws(candidate: np.ndarray | None, baseline: np.ndarray | None) -> np.ndarray | None:
    """Draw-by-draw ratios ``candidate / baseline`` (``None`` when either is missing or the
    baseline's draws touch 0)."""
    if candidate is None or baseline is None or np.any(baseline == 0):
        return None
    return candidate / baseline


def compare_figure(
    candidate: Evidence,
    baseline: Evidence,
    figure: str,
    *,
    confidence: float = 0.95,
    n: int = 1000,
    seed: int = 0,
) -> Difference:
    """How ``figure`` of ``candidate`` differs from ``baseline``'s (:class:`Difference`)."""
    rng = np.random.default_rng(seed)
    c, b = draws(candidate, figure, n=n, rng=rng), draws(baseline, figure, n=n, rng=rng)
    ec, eb = point(candidate, figure)[0], point(baseline, figure)[0]
    ratio = ec / eb if ec is not None and eb else None
    low = high = None
    if (r := ratio_draws(c, b)) is not None and ratio is not None:
        low, high = interval(r, confidence)
    p, test = p_value(candidate, baseline, figure)
    return Difference(ratio, low, high, p, test)


def median_ratio(
    candidate: Evidence,
    baseline: Evidence,
    sample: str,
    *,
    confidence: float = 0.95,
    n: int = 1000,
    seed: int = 0,
) -> Difference:
    """The ratio of the medians of sample ``sample`` (``fast.ttft_ms``): candidate over
    baseline, its hierarchical-bootstrap interval and the Mann-Whitney U p-value. ``ratio``
    is ``None`` when either side has no such sample."""
    a, b = candidate.sample(sample), baseline.sample(sample)
    p, test = p_value(candidate, baseline, sample)
    if not len(a) or not len(b) or float(np.median(b["value"])) == 0:
        return Difference(None, None, None, p, test)
    rng = np.random.default_rng(seed)
    r = ratio_draws(_bootstrap(a, 50, n, rng), _bootstrap(b, 50, n, rng))
    ratio = float(np.median(a["value"]) / np.median(b["value"]))
    low, high = interval(r, confidence) if r is not None else (None, None)
    return Difference(ratio, low, high, p, test)


def impact(
    full: Evidence,
    control: Evidence,
    victims: Sequence[str],
    *,
    confidence: float = 0.95,
    n: int = 1000,
) -> dict[str, float | None]:
    """What the aggressors cost the ``victims`` groups: a run with them (``full``) against the
    same schedule without them (``control``). ``impact.<group>.<figure>`` is the ratio of each
    of :data:`~harness.runfolder.IMPACT_FIGURES` (full / control; ``ttft_p99_ms`` ->
    ``impact.fast.ttft_p99``), ``impact.server.preemptions`` and
    ``impact.server.kv_cache_usage_peak_perc`` the difference (full - control); each with
    ``_low`` and ``_high``, its interval's ends from independent draws of both arms (``None``
    where either arm did not measure it)."""
    out: dict[str, float | None] = {}
    for figure in [f"{g}.{f}" for g in victims for f in IMPACT_FIGURES]:
        diff = compare_figure(full, control, figure, confidence=confidence, n=n)
        name = impact_name(figure)
        out.update(
            {name: diff.ratio, f"{name}_low": diff.ratio_low, f"{name}_high": diff.ratio_high}
        )
    rng = np.random.default_rng(0)
    for figure in IMPACT_DIFFERENCES:
        a, b = point(full, figure)[0], point(control, figure)[0]
        da, db = draws(full, figure, n=n, rng=rng), draws(control, figure, n=n, rng=rng)
        name = impact_name(figure)
        value = a - b if a is not None and b is not None else None
        low, high = (
            interval(da - db, confidence) if da is not None and db is not None else (None, None)
        )
        out.update({name: value, f"{name}_low": low, f"{name}_high": high})
    return out
