"""Figures: a run summary flattened into named numbers, for gates, comparisons and reports.

Names (units in the name, as in ``summary.json``):

- ``<group>.<field>`` for every numeric field of :class:`~harness.runfolder.GroupSummary`
  (``fast.ttft_p99_ms``, ``slow.output_tokens`` ...) and ``<group>.outcome.<outcome>`` for the
  outcome counts (``slow.outcome.client_abort``; an outcome that never happened counts 0);
- ``server.<field>`` for every numeric field of :class:`~harness.runfolder.ServerSummary`
  (``server.preemptions``, ``server.kv_cache_usage_peak_perc`` ...);
- ``proxy.<field>`` for every numeric field of :class:`~harness.runfolder.ProxySummary`
  (``proxy.rss_peak_bytes`` ...) when the run had a proxy summary (of a chain: its first hop);
- ``proxy.hop<i>.<field>`` for each hop of the proxy (``proxy.hops``; 0 faces the clients, a
  single proxy is hop 0): its sizes (:data:`HOP_FIELDS`: ``proxy.hop1.rss_peak_bytes``) and its
  own metrics by the names ``summary.json`` gives them (``proxy.hop0.requests``,
  ``proxy.hop1.open_connections_peak``); ``None`` for a hop the run did not have;
- ``accelerator.<field>`` for every numeric field of
  :class:`~harness.runfolder.AcceleratorSummary` (``accelerator.memory_used_peak_bytes``):
  ``None`` where the run had no GPU to sample;
- run-level figures: ``duration_s``, ``client_saturated`` (1 or 0), and the KV-held verdict's
  ``kv_held_after_finish_s``, ``kv_held_peak_perc``, ``kv_held_peak_bytes`` and
  ``kv_cache_bytes`` (the held peak and the engine's KV pool in bytes: ``None`` where the
  engine did not give the size of its blocks), ``kv_seconds``,
  ``undelivered_peak_bytes``, ``engine_held`` (1 when the verdict says HELD, else 0),
  ``engine_held_victims`` and ``victim_wait_max_ms`` (requests queued behind a held engine,
  and their longest wait to be scheduled) (``None`` when no ``/metrics`` scrape succeeded).

- a disconnect-matrix cell's own figures (``MatrixCell.figures``) in place of its group's of
  the same names: in a cell whose leavers never reached its phase they are ``None`` and
  ``<cell>.exercised`` is 0, so that a gate on them is inconclusive, never a vacuous pass.

A figure that was not measured (for example ITL of a group that got no tokens) is ``None``.
New numeric fields of the summary models become figures without changes here.

Samples are the per-request (ITL, inter-chunk: per-token and per-gap) values behind a group's
latency figures, named ``<group>.<kind>`` with a kind of :data:`SAMPLE_KINDS`
(``fast.ttft_ms``): what a distribution gate (``fast.ttft_ms ~ baseline``) compares, and what
the confidence intervals of the figures in :data:`SAMPLE_FIGURES` are bootstrapped from
(``harness.analysis._uncertainty``).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from harness.runfolder._schema import (
    AcceleratorSummary,
    GroupSummary,
    HopSummary,
    ProxySummary,
    RunSummary,
    ServerSummary,
)
from loadgen import OUTCOMES

# Run-level figure name -> key in the kv_held_by_undelivered_streams verdict.
_KV_VERDICT = {
    "kv_held_after_finish_s": "kv_held_s",
    "kv_held_peak_perc": "kv_held_peak_perc",
    "kv_held_peak_bytes": "kv_held_peak_bytes",
    "kv_cache_bytes": "kv_cache_bytes",
    "kv_seconds": "kv_seconds",
    "undelivered_peak_bytes": "undelivered_peak_bytes",
    "engine_held_victims": "victims",
    "victim_wait_max_ms": "victim_wait_max_ms",
}
RUN_FIGURES = ("duration_s", "client_saturated", "engine_held", *_KV_VERDICT)

# Per-request samples of a group, by kind: ms each (ITL per token, inter-chunk per gap).
SAMPLE_KINDS = (
    "ttft_ms", "itl_ms", "inter_chunk_ms", "tpot_ms", "e2e_ms",
    "send_lag_ms", "ttft_from_scheduled_ms", "e2e_from_scheduled_ms",
)  # fmt: skip
# A group's figures that are one statistic of one sample kind: field -> (kind, statistic),
# the statistic a percentile (0..100) or "mean". Their intervals come from the requests.
SAMPLE_FIGURES: dict[str, tuple[str, float | str]] = {
    "ttft_p50_ms": ("ttft_ms", 50), "ttft_p90_ms": ("ttft_ms", 90), "ttft_p99_ms": ("ttft_ms", 99),
    "itl_p50_ms": ("itl_ms", 50), "itl_p99_ms": ("itl_ms", 99),
    "inter_chunk_p50_ms": ("inter_chunk_ms", 50), "inter_chunk_p99_ms": ("inter_chunk_ms", 99),
    "inter_chunk_mean_ms": ("inter_chunk_ms", "mean"),
    "tpot_p50_ms": ("tpot_ms", 50), "e2e_p50_ms": ("e2e_ms", 50),
    "send_lag_p50_ms": ("send_lag_ms", 50), "send_lag_p99_ms": ("send_lag_ms", 99),
    "ttft_from_scheduled_p50_ms": ("ttft_from_scheduled_ms", 50),
    "ttft_from_scheduled_p99_ms": ("ttft_from_scheduled_ms", 99),
    "e2e_from_scheduled_p50_ms": ("e2e_from_scheduled_ms", 50),
    "e2e_from_scheduled_p99_ms": ("e2e_from_scheduled_ms", 99),
}  # fmt: skip


def _is_number_type(annotation: Any) -> bool:
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    kinds = set(args or (annotation,)) - {type(None)}
    return bool(kinds) and kinds <= {int, float}


def numeric_fields(model: type[BaseModel]) -> list[str]:
    """Names of the fields of ``model`` typed ``int``/``float`` (optionally ``None``)."""
    return [n for n, f in model.model_fields.items() if _is_number_type(f.annotation)]


HOP_FIELDS = tuple(f for f in numeric_fields(HopSummary) if f.endswith("_bytes"))
"""A proxy hop's sizes that are figures (``proxy.hop<i>.<field>``)."""


def hop_figure_names(index: int, metrics: Iterable[str] = ()) -> list[str]:
    """The figure names of proxy hop ``index`` (``proxy.hop<index>.<name>``): its
    :data:`HOP_FIELDS` and ``metrics`` (the names its own metrics take), sorted."""
    return sorted(f"proxy.hop{index}.{name}" for name in (*HOP_FIELDS, *metrics))


def figure_names(groups: Iterable[str]) -> list[str]:
    """Every valid figure name for a scenario with these user group names, sorted (without
    the proxy hops': :func:`hop_figure_names`)."""
    names = list(RUN_FIGURES)
    names += [f"server.{f}" for f in numeric_fields(ServerSummary)]
    names += [f"proxy.{f}" for f in numeric_fields(ProxySummary)]
    names += [f"accelerator.{f}" for f in numeric_fields(AcceleratorSummary)]
    for g in groups:
        names += [f"{g}.{f}" for f in numeric_fields(GroupSummary)]
        names += [f"{g}.outcome.{o}" for o in OUTCOMES]
    return sorted(names)


# A control arm's impact figures (``harness.analysis._uncertainty``): per victim group, the
# ratio of these figures with the aggressors to without, and their interval's ends.
IMPACT_FIGURES = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms")
# Server figures whose impact is a difference (with minus without), not a ratio.
IMPACT_DIFFERENCES = ("server.preemptions", "server.kv_cache_usage_peak_perc")


def impact_name(figure: str) -> str:
    """The impact figure of ``figure``: ``impact.<figure>`` without its ``_ms`` unit (a ratio
    has none): ``fast.ttft_p99_ms`` -> ``impact.fast.ttft_p99``."""
    return "impact." + figure.removesuffix("_ms")


def impact_names(victims: Iterable[str]) -> list[str]:
    """Every impact figure name for these victim groups: ``impact.<group>.<figure>`` (ratio),
    ``impact.server.preemptions`` (difference), each with ``_low`` and ``_high`` (its
    interval's ends)."""
    bases = [f"{g}.{f}" for g in victims for f in IMPACT_FIGURES] + list(IMPACT_DIFFERENCES)
    return sorted(impact_name(b) + end for b in bases for end in ("", "_low", "_high"))


def sample_names(groups: Iterable[str]) -> list[str]:
    """Every valid sample name (``<group>.<kind>``) for these group names, sorted."""
    return sorted(f"{g}.{k}" for g in groups for k in SAMPLE_KINDS)


def sample_of(figure: str) -> tuple[str, float | str] | None:
    """The sample name and statistic behind ``figure`` (``fast.ttft_p99_ms`` ->
    ``("fast.ttft_ms", 99)``), or ``None`` for a figure that is not one statistic of a
    group's requests (server, proxy and run figures, counts, rates)."""
    owner, _, field = figure.rpartition(".")
    if not owner or field not in SAMPLE_FIGURES or owner.split(".")[0] in ("server", "proxy"):
        return None
    kind, stat = SAMPLE_FIGURES[field]
    return f"{owner}.{kind}", stat


def figures(summary: RunSummary) -> dict[str, float | None]:
    """The run's figures by name (see the module docstring). Values are floats or ``None``."""
    out: dict[str, float | None] = {
        "duration_s": summary.duration_s,
        "client_saturated": 1.0 if summary.client_saturation.saturated else 0.0,
    }
    kv = summary.verdicts.get("kv_held_by_undelivered_streams", {})
    # Without one successful scrape the KV figures were not measured (not 0): their gates fail.
    measured = (
        summary.server.scrapes - summary.server.failed_scrapes > 0
        or kv.get("source") == "engine_probe"
    )
    for name, key in _KV_VERDICT.items():
        out[name] = _float(kv.get(key)) if measured else None
    out["engine_held"] = (1.0 if kv.get("status") == "held" else 0.0) if measured else None
    for f in numeric_fields(ServerSummary):
        out[f"server.{f}"] = _float(getattr(summary.server, f))
    for f in numeric_fields(ProxySummary):
        out[f"proxy.{f}"] = None if summary.proxy is None else _float(getattr(summary.proxy, f))
    gpus = summary.accelerator
    for f in numeric_fields(AcceleratorSummary):
        out[f"accelerator.{f}"] = None if gpus is None else _float(getattr(gpus, f))
    for hop in summary.proxy.hops if summary.proxy is not None else []:
        prefix = f"proxy.hop{hop.index}."
        out.update({prefix + f: _float(getattr(hop, f)) for f in HOP_FIELDS})
        out.update({prefix + name: float(value) for name, value in hop.metrics.items()})
    for g in summary.groups:
        for f in numeric_fields(GroupSummary):
            out[f"{g.group}.{f}"] = _float(getattr(g, f))
        for o in sorted(set(OUTCOMES) | set(g.outcomes)):
            out[f"{g.group}.outcome.{o}"] = float(g.outcomes.get(o, 0))
    for cell in summary.matrix:  # a matrix cell's own figures take its group's place
        out.update(cell.figures())
    return out


def _float(value: Any) -> float | None:
    return None if value is None else float(value)
