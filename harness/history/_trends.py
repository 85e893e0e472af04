"""A scenario's history as trends: each figure over the runs of each series, with its change
points, for ``zerowindow history show`` and ``history check``."""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.history._store import HistoryStore
from harness.history._trend import MAX_PVALUE, ChangePoint, change_points, worse_direction

# Figures shown when none is asked for (besides those the scenario's gates name).
DEFAULT_FIGURES = ("*.ttft_p99_ms", "*.itl_p99_ms", "*.output_tokens_per_s",
                   "kv_held_after_finish_s", "duration_s")  # fmt: skip


@dataclass
class FigureTrend:
    """One figure over one series: ``runs`` (oldest first: ``entry_id``, ``started_utc``,
    ``commit_sha``, ``ci_run_id``, ``status``, ``repeats``, ``folder``, ``value``, ``low``,
    ``high``, and ``bound``: the bound of an absolute gate on it, where there was one),
    ``points`` its change points, ``direction`` which way is worse."""

    figure: str
    series: str
    series_key: dict[str, Any]
    runs: pd.DataFrame
    points: list[ChangePoint] = field(default_factory=list)

    @property
    def direction(self) -> str:
        return worse_direction(self.figure)

    @property
    def values(self) -> list[float]:
        return [float(v) for v in self.runs["value"]]


def series_label(key: dict[str, Any]) -> str:
    """A series for a person: configuration, engine, model, machine, accelerator."""
    engine = ", ".join(f"{k} {v}" for k, v in key.get("engine", {}).items()) or "-"
    machine = key.get("machine", {})
    cpu = f"{machine.get('cpus')} x {machine.get('cpu_model') or 'CPU'}"
    gpu = ", ".join(key["accelerator"]) if key.get("accelerator") else "no GPU"
    parts = [key.get("arm"), f"{key.get('target_kind')} ({engine})", key.get("model"),
             f"{cpu}, {machine.get('memory_gib')} GiB", gpu]  # fmt: skip
    return " | ".join(str(p) for p in parts)


def trends(
    store: HistoryStore,
    scenario: str,
    *,
    figures: Sequence[str] = (),
    since: str | None = None,
    max_pvalue: float | None = MAX_PVALUE,
) -> list[FigureTrend]:
    """Every figure matching ``figures`` (glob patterns; default: the figures the entries'
    gates name and :data:`DEFAULT_FIGURES`) over each series of ``scenario`` (its complete
    runs), with its change
    points (Otava, at ``max_pvalue``; ``None``: none looked for). An empty list when nothing
    matches."""
    entries = store.entries(scenario, since=since)
    entries = entries[entries["status"] == "complete"]  # others measured part of the workload
    if entries.empty:
        return []
    ids = list(entries["entry_id"])
    values, gates = store.figures(ids), store.gates(ids)
    named = list(dict.fromkeys(gates["figure"].dropna())) if len(gates) else []
    patterns = list(figures) or [*named, *DEFAULT_FIGURES]
    names = [n for n in dict.fromkeys(values["figure"])
             if any(fnmatch.fnmatchcase(n, p) for p in patterns)]  # fmt: skip
    names.sort(key=lambda n: min(i for i, p in enumerate(patterns) if fnmatch.fnmatchcase(n, p)))
    bounds = gates[gates["bound"].notna() & ~gates["gate"].str.contains("baseline|history")]
    columns = ["entry_id", "started_utc", "commit_sha", "ci_run_id", "status", "repeats",
               "folder", "series"]  # fmt: skip
    out: list[FigureTrend] = []
    for series, runs in entries.groupby("series", sort=False):
        key = runs["series_key"].iloc[0]
        for name in names:
            rows = runs[columns].merge(values[values["figure"] == name], on="entry_id")
            rows = rows[rows["value"].notna()]
            if rows.empty:
                continue
            bound = bounds[bounds["figure"] == name][["entry_id", "bound"]].drop_duplicates(
                "entry_id"
            )
            rows = rows.merge(bound, on="entry_id", how="left").reset_index(drop=True)
            trend = FigureTrend(name, str(series), key, rows)
            if max_pvalue is not None:
                trend.points = change_points(trend.values, max_pvalue=max_pvalue)
            out.append(trend)
    return out
