"""A run with repeats for people: each figure with its interval and per-repeat values (the
console and the GitHub step summary), beside the gates (``harness.lifecycle._repeats``)."""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.gates import GateResult
from harness.outputs._format import fmt_number
from harness.outputs._step_summary import gate_mark

# Shown beside the gated figures: each group's latency figures.
_SHOWN = ("ttft_p50_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p99_ms", "e2e_p50_ms")


def shown_figures(figures: Mapping[str, Mapping[str, Any]], gated: Sequence[str]) -> list[str]:
    """The figures worth a line: every gated figure (``gated``: the gates' figures), then each
    group's latency figures."""
    gated = [g for g in gated if g in figures]
    latency = [n for n in figures if n.rpartition(".")[2] in _SHOWN and n not in gated]
    return list(dict.fromkeys(gated + sorted(latency)))


def interval_text(row: Mapping[str, Any], digits: int = 1) -> str:
    """``value [low, high]`` (``value`` alone without an interval; ``-`` unmeasured)."""
    value, low, high = row.get("value"), row.get("low"), row.get("high")
    if value is None:
        return "-"
    span = "" if low is None else f" [{fmt_number(low, digits)}, {fmt_number(high, digits)}]"
    return f"{fmt_number(value, digits)}{span}"


def impact_lines(impact: Mapping[str, float | None]) -> list[str]:
    """One line per victim group (and the server) of a control arm's impact figures:
    ``fast: ttft_p99 x3.40 [2.90, 4.10], ...``; ``server: preemptions +28 [20, 36], ...``."""
    by_owner: dict[str, list[str]] = {}
    for name, value in impact.items():
        if name.endswith(("_low", "_high")) or value is None:
            continue
        owner, _, figure = name.removeprefix("impact.").rpartition(".")
        low, high = impact.get(f"{name}_low"), impact.get(f"{name}_high")
        if owner == "server":
            span = "" if low is None or high is None else f" [{low:+.3g}, {high:+.3g}]"
            text = f"{figure} {value:+.3g}{span}"
        else:
            span = "" if low is None or high is None else f" [{low:.2f}, {high:.2f}]"
            text = f"{figure} x{value:.2f}{span}"
        by_owner.setdefault(owner, []).append(text)
    return [f"{owner}: {', '.join(parts)}" for owner, parts in by_owner.items()]


def _per_repeat(row: Mapping[str, Any]) -> str:
    return ", ".join(fmt_number(v, 1) for v in row.get("per_repeat", []))


def print_repeats(
    figures: Mapping[str, Mapping[str, Any]],
    gates: Sequence[GateResult],
    *,
    repeats: int,
    confidence: float,
    impact: Mapping[str, float | None] | None = None,
    verdicts: Sequence[tuple[str, Sequence[str]]] = (),
    console: Console | None = None,
) -> None:
    """Print the figures of :func:`shown_figures` with their intervals and per-repeat values,
    a control arm's impact (:func:`impact_lines`) and each run's verdict lines (``verdicts``:
    the run's folder name, e.g. ``r1`` or ``c1``, and its lines)."""
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(
        title=f"{repeats} repeats: figures with {confidence:.0%} intervals", title_justify="left"
    )
    for col in ("figure", "estimate [interval]", "method", "per repeat"):
        table.add_column(col)
    for name in shown_figures(figures, [g.figure for g in gates]):
        row = figures[name]
        table.add_row(escape(name), interval_text(row), str(row.get("method")), _per_repeat(row))
    console.print(table)
    if impact:
        console.print("impact of the aggressors (with / without them; server: with - without):")
        for line in impact_lines(impact):
            console.print(f"  {escape(line)}")
    for name, lines in verdicts:
        for line in lines:
            console.print(f"{name}: {line}", markup=False)


def repeats_markdown(
    scenario: str,
    figures: Mapping[str, Mapping[str, Any]],
    gates: Sequence[GateResult],
    *,
    run_dir: Path,
    exit_code: int,
    impact: Mapping[str, float | None] | None = None,
) -> str:
    """The GitHub step summary section of a run with repeats: the gates (verdict and reason:
    intervals, effect, p-value) and the figures with their intervals."""
    mark = "✅" if exit_code == 0 else "❌"
    out = [f"### {mark} zerowindow `{scenario}` (repeats, exit {exit_code})", ""]
    if gates:
        out += ["| | gate | verdict | reason |", "| --- | --- | --- | --- |"]
        for g in gates:
            reason = g.reason.replace("|", "\\|")
            out.append(f"| {gate_mark(g)} | `{g.gate}` | {g.verdict} | {reason} |")
        out.append("")
    out += ["| figure | estimate [interval] | per repeat |", "| --- | ---: | --- |"]
    for name in shown_figures(figures, [g.figure for g in gates]):
        out.append(f"| `{name}` | {interval_text(figures[name])} | {_per_repeat(figures[name])} |")
    if impact:
        out += ["", "Impact of the aggressors (with / without them; server: with - without):", ""]
        out += [f"- {line}" for line in impact_lines(impact)]
    out += ["", f"Run folder: `{run_dir}`", ""]
    return "\n".join(out)
