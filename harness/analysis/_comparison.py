"""Proxy configurations side by side: the comparison tables and the buffering-distortion flag.

Input: the figures of each configuration of one comparison (same workload, same target), in
scenario order: one run's summary, or the estimates over the configuration's repeats
(:class:`ArmFigures`). Output:

- ``groups``: one row per (configuration, user group): outcomes, TTFT, per-token ITL and
  inter-chunk latency percentiles, and for stalled streams the time from stall onset to the
  client seeing RST/FIN (``stall_to_cut_*_ms``) and to the engine's abort
  (``stall_to_abort_*_ms``);
- ``configurations``: one row per configuration: wasted decode (``undelivered_tokens``, also
  per stalled stream), server KV peak and preemptions, proxy memory and buffered bytes;
- ``distortion``: per configuration, whether it buffers the stream (below).

**Buffering distortion.** A proxy that buffers the response delivers it in bursts: the healthy
readers' first token comes later and the gaps between the chunks they receive get shorter. A
configuration is flagged ``buffering`` when, for some healthy group (full-speed readers
without a client action), against the ``none`` configuration, TTFT p50 rose by at least
``ttft_rise_ratio`` (and ``min_ttft_rise_ms``) while inter-chunk p50 fell to at most
``inter_chunk_fall_ratio`` of the baseline. When the baseline's inter-chunk p50 is 0 ms (the
client reads several chunks at once, as a loaded client of vLLM does), the inter-chunk mean
stands in for it. Without a ``none`` configuration or a healthy group, or when the load
generator was saturated in either run (the summary's ``client_saturation``: latencies are then
unreliable), the verdict is ``not_evaluated``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from harness.runfolder import RunSummary, figures, to_builtin

GROUP_COLUMNS = [
    "configuration", "group", "requests", "outcomes",
    "ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms",
    "inter_chunk_p50_ms", "inter_chunk_p99_ms", "inter_chunk_mean_ms",
    "stalled", "cut_seen", "cut_rst", "stall_to_cut_p50_ms", "stall_to_cut_max_ms",
    "engine_aborted", "stall_to_abort_p50_ms", "stall_to_abort_max_ms",
]  # fmt: skip
COUNT_COLUMNS = ("requests", "stalled", "cut_seen", "cut_rst", "engine_aborted")
CONFIG_COLUMNS = [
    "configuration", "kind", "status", "generation_tokens", "undelivered_tokens",
    "undelivered_tokens_per_stalled", "kv_cache_usage_peak_perc", "preemptions",
    "proxy_rss_peak_bytes", "proxy_buffered_peak_bytes", "stream_buffered_peak_mean_bytes",
    "client_send_q_peak_bytes", "upstream_recv_q_peak_bytes", "proxy_cuts",
    "proxy_upstream_aborts",
]  # fmt: skip


class DistortionThresholds(BaseModel):
    """When a configuration counts as buffering the stream (ratios against ``none``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    ttft_rise_ratio: float = Field(1.25, gt=1)
    min_ttft_rise_ms: float = Field(5.0, ge=0)
    inter_chunk_fall_ratio: float = Field(0.8, gt=0, lt=1)


@dataclass(frozen=True)
class Comparison:
    """The comparison of one run: see the module docstring. ``baseline`` is the name of the
    ``none`` configuration (or ``None``); ``healthy_groups`` the groups the flag looks at;
    ``intervals`` per configuration the intervals of the group rows' latencies (ms)
    (``<group>.<column>`` -> low, high), ``repeats`` how many runs each configuration had."""

    groups: pd.DataFrame
    configurations: pd.DataFrame
    distortion: list[dict[str, Any]]
    baseline: str | None
    healthy_groups: list[str]
    intervals: dict[str, dict[str, tuple[float, float]]] = field(default_factory=dict)
    repeats: dict[str, int] = field(default_factory=dict)

    def interval(self, configuration: str, figure: str) -> tuple[float, float] | None:
        """The interval of ``figure`` (``fast.ttft_p50_ms``) in ``configuration``, if any."""
        return self.intervals.get(configuration, {}).get(figure)

    def as_dict(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline,
            "healthy_groups": self.healthy_groups,
            "repeats": self.repeats,
            "intervals": {c: {f: list(s) for f, s in v.items()} for c, v in self.intervals.items()},
            "groups": _records(self.groups),
            "configurations": _records(self.configurations),
            "distortion": self.distortion,
        }


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    clean = frame.astype(object).where(frame.notna(), None)
    return [to_builtin(r) for r in clean.to_dict(orient="records")]


@dataclass(frozen=True)
class ArmFigures:
    """What the comparison takes of one configuration: its ``figures`` (one run's
    :func:`~harness.runfolder.figures`, or the estimates over its repeats), its user groups
    (``groups``, in the summary's order), ``status`` (``complete`` when every run completed),
    whether its load generator was ``saturated`` in any run, the proxy's kind and cuts by
    reason (mean over the runs), ``repeats``, how many runs the figures stand for, and the
    ``intervals`` of its figures (figure name -> low, high) where it has them."""

    figures: Mapping[str, float | None]
    groups: list[str]
    status: str = "complete"
    saturated: bool = False
    proxy_kind: str | None = None
    cut_reasons: Mapping[str, float] = field(default_factory=dict)
    repeats: int = 1
    intervals: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @classmethod
    def of(cls, summary: RunSummary) -> ArmFigures:
        """The figures of one run's summary."""
        return cls(
            figures=figures(summary),
            groups=[g.group for g in summary.groups],
            status=summary.status,
            saturated=summary.client_saturation.saturated,
            proxy_kind=summary.proxy.kind if summary.proxy else None,
            cut_reasons=dict(summary.proxy.cut_reasons) if summary.proxy else {},
        )


def _outcomes(figs: Mapping[str, float | None], group: str) -> str:
    prefix = f"{group}.outcome."
    counts = {k.removeprefix(prefix): v for k, v in figs.items() if k.startswith(prefix) and v}
    return ", ".join(f"{k} {v:g}" for k, v in sorted(counts.items()))


def _count(value: float | None) -> float | int | None:
    """A count as an ``int`` when it is whole (one run's; a mean over repeats may not be)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def group_rows(arms: Mapping[str, ArmFigures]) -> pd.DataFrame:
    """One row per (configuration, group), columns :data:`GROUP_COLUMNS`."""
    rows = []
    for name, arm in arms.items():
        for group in arm.groups:
            row: dict[str, Any] = {c: arm.figures.get(f"{group}.{c}") for c in GROUP_COLUMNS}
            row.update({c: _count(row[c]) for c in COUNT_COLUMNS})
            row.update(configuration=name, group=group, outcomes=_outcomes(arm.figures, group))
            rows.append(row)
    return pd.DataFrame(rows, columns=GROUP_COLUMNS)


def config_rows(arms: Mapping[str, ArmFigures]) -> pd.DataFrame:
    """One row per configuration, columns :data:`CONFIG_COLUMNS`."""
    rows = []
    for name, arm in arms.items():
        f = arm.figures
        stalled = sum(f.get(f"{g}.stalled") or 0 for g in arm.groups if "." not in g)
        wasted = f.get("server.undelivered_tokens")
        rows.append(
            {
                "configuration": name,
                "kind": arm.proxy_kind,
                "status": arm.status,
                "generation_tokens": f.get("server.generation_tokens"),
                "undelivered_tokens": wasted,
                "undelivered_tokens_per_stalled": wasted / stalled
                if wasted is not None and stalled
                else None,
                "kv_cache_usage_peak_perc": f.get("server.kv_cache_usage_peak_perc"),
                "preemptions": f.get("server.preemptions"),
                "proxy_rss_peak_bytes": f.get("proxy.rss_peak_bytes"),
                "proxy_buffered_peak_bytes": f.get("proxy.buffered_peak_bytes"),
                "stream_buffered_peak_mean_bytes": f.get("proxy.stream_buffered_peak_mean_bytes"),
                "client_send_q_peak_bytes": f.get("proxy.client_send_q_peak_bytes"),
                "upstream_recv_q_peak_bytes": f.get("proxy.upstream_recv_q_peak_bytes"),
                "proxy_cuts": _cuts(f.get("proxy.cuts"), arm.cut_reasons),
                "proxy_upstream_aborts": f.get("proxy.upstream_aborts"),
            }
        )
    return pd.DataFrame(rows, columns=CONFIG_COLUMNS)


def _positive(value: Any) -> float | None:
    """``value`` as a float if it is a number >= 0, else ``None``."""
    if value is None or pd.isna(value) or value < 0:
        return None
    return float(value)


def _cuts(cuts: float | None, reasons: Mapping[str, float]) -> str | None:
    """``"3 (overflow 3)"``: the egress buffer's cuts and their reasons."""
    if cuts is None:
        return None
    text = ", ".join(f"{k} {v:g}" for k, v in reasons.items())
    return f"{cuts:g}" + (f" ({text})" if text else "")


def _group_evidence(
    b: pd.Series, t: pd.Series, group: str, th: DistortionThresholds
) -> dict[str, Any] | None:
    """One healthy group's evidence (baseline row ``b``, this configuration's ``t``), or
    ``None`` when either lacks a TTFT or inter-chunk latency to compare."""
    # p50; the mean when the baseline's p50 is 0 ms (the client reads several chunks at once,
    # so most gaps are 0 even without a proxy).
    stat = "inter_chunk_p50_ms"
    if _positive(b[stat]) is not None and b[stat] == 0:
        stat = "inter_chunk_mean_ms"
    values = [b["ttft_p50_ms"], t["ttft_p50_ms"], b[stat], t[stat]]
    if any(_positive(v) is None for v in values) or min(values[0], values[2]) <= 0:
        return None
    ttft_ratio = t["ttft_p50_ms"] / b["ttft_p50_ms"]
    gap_ratio = t[stat] / b[stat]
    buffering = (
        ttft_ratio >= th.ttft_rise_ratio
        and t["ttft_p50_ms"] - b["ttft_p50_ms"] >= th.min_ttft_rise_ms
        and gap_ratio <= th.inter_chunk_fall_ratio
    )
    return {
        "group": group,
        "ttft_p50_ms": [float(b["ttft_p50_ms"]), float(t["ttft_p50_ms"])],
        "inter_chunk_statistic": "p50" if stat == "inter_chunk_p50_ms" else "mean",
        "inter_chunk_ms": [float(b[stat]), float(t[stat])],
        "ttft_ratio": float(ttft_ratio),
        "inter_chunk_ratio": float(gap_ratio),
        "buffering": bool(buffering),
    }


def _not_evaluated(name: str, why: str) -> dict[str, Any]:
    return {"configuration": name, "status": "not_evaluated", "evidence": [],
            "line": f"{name}: buffering not evaluated ({why})"}  # fmt: skip


def _verdict(
    name: str, baseline: str, evidence: list[dict[str, Any]], saturated: Collection[str]
) -> dict[str, Any]:
    """The configuration's verdict and its line from the healthy groups' ``evidence``."""
    flagged = [e for e in evidence if e["buffering"]]
    shown = flagged[0] if flagged else evidence[0]
    numbers = (
        f"{shown['group']}: TTFT p50 {shown['ttft_p50_ms'][0]:.1f} -> "
        f"{shown['ttft_p50_ms'][1]:.1f} ms (x{shown['ttft_ratio']:.2f}), inter-chunk "
        f"{shown['inter_chunk_statistic']} {shown['inter_chunk_ms'][0]:.2f} -> "
        f"{shown['inter_chunk_ms'][1]:.2f} ms "
        f"(x{shown['inter_chunk_ratio']:.2f}) against {baseline}"
    )
    status = "buffering" if flagged else "streaming"
    verdict = "BUFFERS the stream" if flagged else "streams (no buffering distortion)"
    line = f"{name}: {verdict}; {numbers}"
    unreliable = [n for n in (baseline, name) if n in saturated]
    if unreliable:
        status = "not_evaluated"
        line = (
            f"{name}: buffering not evaluated (client saturated in "
            f"{' and '.join(unreliable)}: latency figures unreliable); would say: "
            f"{verdict}; {numbers}"
        )
    return {"configuration": name, "status": status, "evidence": evidence, "line": line}


def buffering_distortion(
    groups: pd.DataFrame,
    *,
    baseline: str | None,
    healthy_groups: list[str],
    thresholds: DistortionThresholds | None = None,
    saturated: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The buffering verdict of every configuration but the baseline (module docstring).
    ``saturated`` names configurations whose load generator was saturated: their latencies
    (or the baseline's) cannot be trusted, so the verdict is ``not_evaluated`` (the numbers are
    still given).

    ``groups`` is a :func:`group_rows` frame. Each verdict: ``configuration``, ``status``
    (``buffering`` | ``streaming`` | ``not_evaluated``), ``evidence`` (per healthy group: TTFT
    and inter-chunk p50 in ms, baseline and this configuration, and their ratios) and ``line``.
    """
    th = thresholds or DistortionThresholds()
    out: list[dict[str, Any]] = []
    names = [str(n) for n in pd.unique(groups["configuration"])] if len(groups) else []
    for name in names:
        if name == baseline:
            continue
        if baseline is None or not healthy_groups:
            why = "no 'none' configuration" if baseline is None else "no healthy reader group"
            out.append(_not_evaluated(name, why))
            continue
        evidence: list[dict[str, Any]] = []
        skipped: list[str] = []
        for group in healthy_groups:
            base = groups[(groups["configuration"] == baseline) & (groups["group"] == group)]
            this = groups[(groups["configuration"] == name) & (groups["group"] == group)]
            if base.empty or this.empty:
                continue
            item = _group_evidence(base.iloc[0], this.iloc[0], group, th)
            if item is None:
                skipped.append(f"{group}: no TTFT or inter-chunk latency to compare in {baseline}")
            else:
                evidence.append(item)
        if not evidence:
            out.append(_not_evaluated(name, "; ".join(skipped) or "no healthy group ran in both"))
        else:
            out.append(_verdict(name, baseline, evidence, saturated))
    return out


def compare(
    arms: Mapping[str, ArmFigures | RunSummary],
    *,
    kinds: Mapping[str, str],
    healthy_groups: list[str],
    thresholds: DistortionThresholds | None = None,
) -> Comparison:
    """Build the :class:`Comparison` of ``arms`` (configuration name -> its figures, or one
    run's summary; in run order). ``kinds`` maps configuration names to proxy kinds; the first
    ``none`` one is the baseline."""
    figs = {n: a if isinstance(a, ArmFigures) else ArmFigures.of(a) for n, a in arms.items()}
    baseline = next((n for n in figs if kinds.get(n) == "none"), None)
    groups = group_rows(figs)
    return Comparison(
        groups=groups,
        configurations=config_rows(figs),
        distortion=buffering_distortion(
            groups,
            baseline=baseline,
            healthy_groups=healthy_groups,
            thresholds=thresholds,
            saturated={n for n, a in figs.items() if a.saturated},
        ),
        baseline=baseline,
        healthy_groups=healthy_groups,
        intervals={
            n: {
                f"{g}.{c}": a.intervals[f"{g}.{c}"]
                for g in a.groups
                for c in GROUP_COLUMNS
                if c.endswith("_ms") and f"{g}.{c}" in a.intervals
            }
            for n, a in figs.items()
        },  # fmt: skip
        repeats={n: a.repeats for n, a in figs.items()},
    )
