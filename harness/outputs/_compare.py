"""Comparison of runs: their figures (``harness.runfolder``) side by side, with ratios against
the first run, as a terminal table, markdown, CSV, JSON, or an HTML page with overlaid TTFT and
ITL CDFs per user class.

A run is a run folder or a run with repeats (its figures over every repeat). Each figure that
has an interval (``harness.analysis._uncertainty``: latency figures from their requests, other
figures over two or more repeats) shows it, and so does its ratio against the first run; a
ratio whose interval excludes 1 is marked ``*`` (a significant difference at that confidence).
"""

from __future__ import annotations

import csv
import fnmatch
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
from markupsafe import Markup
from pydantic import ValidationError
from rich.table import Table

from harness.analysis import (
    compare_figure,
    estimate,
    evidence_of,
    is_plan_folder,
    pooled_figures,
    read_plan,
    run_folders,
    uncertainty_of,
)
from harness.outputs._format import fmt_number
from harness.outputs._report import (
    ReportError,
    RunData,
    cdf_figure,
    fragment,
    itl_ms,
    load_run,
    plotly_js,
    ttft_ms,
    user_classes,
)
from harness.runfolder import RunSummary, figures
from zwcore import RunFolderError

FORMATS = ("table", "markdown", "csv", "json")


Span = tuple[float, float] | None


@dataclass
class FigureRow:
    """One figure across the runs: ``values[i]`` of run ``i`` and ``ratios[i]`` =
    ``values[i] / values[0]`` (``None`` when either is missing or the first is 0);
    ``intervals[i]`` and ``ratio_intervals[i]`` their intervals at the comparison's confidence
    (``None`` without one), ``significant[i]``: the ratio's interval excludes 1."""

    name: str
    values: list[float | None]
    ratios: list[float | None]
    intervals: list[Span] = field(default_factory=list)
    ratio_intervals: list[Span] = field(default_factory=list)

    @property
    def significant(self) -> list[bool]:
        return [s is not None and (s[0] > 1 or s[1] < 1) for s in self.ratio_intervals]


@dataclass
class Comparison:
    """Runs (``labels[i]`` names ``runs[i]``) and their figures, in figure-name order, with
    intervals at ``confidence`` from ``draws`` bootstrap draws."""

    runs: list[RunData]
    labels: list[str]
    rows: list[FigureRow]
    confidence: float = 0.95
    draws: int = 1000


def _summary(data: RunData) -> RunSummary:
    try:
        return RunSummary.model_validate(data.summary)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ReportError(
            f"{data.run_dir / 'summary.json'}: {where}: {err['msg']} "
            "(written by an older zerowindow?)"
        ) from None


def _labels(runs: list[RunData]) -> list[str]:
    scenarios = {r.summary.get("scenario") for r in runs}
    labels = [r.run_dir.name if len(scenarios) == 1 else r.label for r in runs]
    if len(set(labels)) < len(labels):
        labels = [f"{i + 1}:{label}" for i, label in enumerate(labels)]
    return labels


def _ratio(value: float | None, first: float | None) -> float | None:
    if value is None or first is None or first == 0:
        return None
    return value / first


def _expand(run_dirs: Sequence[Path]) -> list[Path]:
    """The folders to compare: a comparison's folder stands for its configurations'."""
    out: list[Path] = []
    for d in map(Path, run_dirs):
        if is_plan_folder(d) and (record := read_plan(d)).plan.kind == "comparison":
            out += [d / a.folder for a in record.plan.arms if record.of_arm(a)]
        else:
            out.append(d)
    return out


def _pooled(dirs: list[Path], label_dir: Path) -> RunData:
    """The runs of ``dirs`` as one (their requests and chunks together, request ids made
    unique per run), for the CDFs; the last run's summary, and the first status that is not
    ``complete``."""
    runs = [load_run(d, with_records=False) for d in dirs]
    data = replace(runs[-1], run_dir=label_dir)
    if len(runs) > 1:
        frames = {"requests": [], "chunks": []}  # type: dict[str, list[pd.DataFrame]]
        for i, run in enumerate(runs):
            for name in frames:
                frame = getattr(run, name).copy()
                if "request_id" in frame:
                    frame["request_id"] = f"r{i + 1}:" + frame["request_id"].astype(str)
                frames[name].append(frame)
        data.requests = pd.concat(frames["requests"], ignore_index=True)
        data.chunks = pd.concat(frames["chunks"], ignore_index=True)
        status = next((r.summary.get("status") for r in runs
                       if r.summary.get("status") != "complete"), "complete")  # fmt: skip
        data.summary = {**data.summary, "status": status}
    return data


def compare_runs(run_dirs: Sequence[Path], only: Sequence[str] = ()) -> Comparison:
    """Read the runs' folders (a run, a run with repeats, or a comparison's folder, which
    stands for its configurations) and line up their figures: those at least one run
    measured (a closed-loop run has no send lag, for one), over each one's repeats. Intervals
    take the first folder's recorded setting (``harness.analysis.uncertainty_of``). ``only``
    keeps the figures whose name matches any of these shell patterns (``fast.ttft_*``,
    ``server.*``). Raises :class:`ReportError` for a folder that cannot be read or an
    incompatible ``summary.json``, and ``ValueError`` when ``only`` matches no figure."""
    runs, evidence, tables = [], [], []
    try:
        folders = _expand(run_dirs)
        confidence, draws = uncertainty_of(folders[0]) if folders else (0.95, 1000)
        for d in folders:
            dirs = run_folders(d)
            evidence.append(evidence_of(dirs))
            runs.append(_pooled(dirs, d))
            tables.append(
                figures(_summary(runs[-1])) if len(dirs) == 1 else pooled_figures(evidence[-1])
            )
    except RunFolderError as exc:
        raise ReportError(str(exc)) from None
    names = list(dict.fromkeys(n for t in tables for n in sorted(t)))
    names = [n for n in names if any(t.get(n) is not None for t in tables)]
    if only:
        names = [n for n in names if any(fnmatch.fnmatchcase(n, p) for p in only)]
        if not names:
            raise ValueError(f"--only {' '.join(only)}: matches no figure")
    rows = []
    for name in names:
        values = [t.get(name) for t in tables]
        row = FigureRow(name, values, [_ratio(v, values[0]) for v in values])
        for ev in evidence:
            est = estimate(ev, name, confidence=confidence, n=draws)
            low, high = est.low, est.high
            row.intervals.append(None if low is None or high is None else (low, high))
            diff = compare_figure(ev, evidence[0], name, confidence=confidence, n=draws)
            low, high = diff.ratio_low, diff.ratio_high
            row.ratio_intervals.append(None if low is None or high is None else (low, high))
        rows.append(row)
    return Comparison(runs, _labels(runs), rows, confidence, draws)


def _ratio_text(ratio: float | None) -> str:
    return "-" if ratio is None else f"×{ratio:.2f}"


def _header(c: Comparison) -> list[str]:
    """Column names; a run that did not complete carries its status (``[interrupted]``,
    ``[failed]``) wherever its label stands, so that its partial figures are not read as a
    whole run's."""
    labels = [
        label if (status := r.summary.get("status", "complete")) == "complete"
        else f"{label} [{status}]"
        for label, r in zip(c.labels, c.runs, strict=True)
    ]  # fmt: skip
    head = ["figure", labels[0]]
    for label in labels[1:]:
        head += [label, f"ratio {label}"]
    return head


def _span_text(span: Span) -> str:
    return "" if span is None else f" [{fmt_number(span[0])}, {fmt_number(span[1])}]"


def _ratio_span_text(span: Span) -> str:
    return "" if span is None else f" [{span[0]:.2f}, {span[1]:.2f}]"


def _cells(row: FigureRow, number: Any = fmt_number, ratio: Any = _ratio_text) -> list[str]:
    """The row's cells; with the default formats each value carries its interval and each
    ratio its interval and ``*`` when significant (CSV keeps raw numbers)."""
    spans = (number is fmt_number) and len(row.intervals) == len(row.values)
    cells = [row.name, number(row.values[0]) + (_span_text(row.intervals[0]) if spans else "")]
    for i in range(1, len(row.values)):
        value, r = number(row.values[i]), ratio(row.ratios[i])
        if spans and row.values[i] is not None:
            value += _span_text(row.intervals[i])
            r += _ratio_span_text(row.ratio_intervals[i]) + ("*" if row.significant[i] else "")
        cells += [value, r]
    return cells


def rich_table(c: Comparison) -> Table:
    """The comparison as a rich table; ratios are against the first run."""
    head = _header(c)
    table = Table(
        title=f"figures [{c.confidence:.0%} interval], ratios against {head[1]} "
        "(*: the ratio's interval excludes 1)",
        title_justify="left",
    )
    for i, col in enumerate(head):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in c.rows:
        table.add_row(*_cells(row))
    return table


def to_markdown(c: Comparison) -> str:
    """A GitHub-flavoured markdown table."""
    head = _header(c)
    lines = ["| " + " | ".join(head) + " |", "| --- |" + " ---: |" * (len(head) - 1)]
    lines += ["| " + " | ".join(_cells(row)) + " |" for row in c.rows]
    return "\n".join(lines) + "\n"


def to_csv(c: Comparison) -> str:
    """CSV with the raw numbers (empty cell: not measured)."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(_header(c))
    raw = lambda v: "" if v is None else repr(v)  # noqa: E731
    for row in c.rows:
        writer.writerow(_cells(row, number=raw, ratio=raw))
    return buf.getvalue()


def to_json(c: Comparison) -> str:
    """``{"runs": [{label, run_dir, scenario, status}], "figures": [{name, values, ratios}]}``."""
    runs = [
        {"label": label, "run_dir": str(r.run_dir), "scenario": r.summary.get("scenario"),
         "status": r.summary.get("status")}
        for label, r in zip(c.labels, c.runs, strict=True)
    ]  # fmt: skip
    rows = [
        {"name": r.name, "values": r.values, "ratios": r.ratios, "intervals": r.intervals,
         "ratio_intervals": r.ratio_intervals, "significant": r.significant}
        for r in c.rows
    ]  # fmt: skip
    return json.dumps({"runs": runs, "figures": rows}, indent=2) + "\n"


def render(c: Comparison, fmt: str) -> str:
    """The comparison in ``fmt`` (``markdown``, ``csv`` or ``json``)."""
    return {"markdown": to_markdown, "csv": to_csv, "json": to_json}[fmt](c)


def figure_page_parts(c: Comparison) -> dict[str, Any]:
    """What a page shows of a comparison: per user class the TTFT and per-token ITL CDFs of
    every run overlaid (``plots``), and the figures' table (``figure_header``,
    ``figure_rows``, ``figure_labels``). Raises :class:`ReportError` for a run without
    requests."""
    for run in c.runs:  # the CDFs need the per-request and per-chunk tables
        if run.requests.empty:
            raise ReportError(f"{run.run_dir / 'requests.parquet'}: missing or empty")
    classes = list(dict.fromkeys(u for r in c.runs for u in user_classes(r)))
    plots = []
    for i, cls in enumerate(classes):
        pairs = list(zip(c.labels, c.runs, strict=True))
        ttft = cdf_figure({lb: ttft_ms(r, cls) for lb, r in pairs}, title=f"{cls}: TTFT", unit="ms")
        itl = cdf_figure(
            {lb: itl_ms(r, cls) for lb, r in pairs}, title=f"{cls}: ITL per token", unit="ms"
        )
        plots.append({
            "user_class": cls,
            "ttft": Markup(fragment(ttft, f"ttft-{i}")),
            "itl": Markup(fragment(itl, f"itl-{i}")),
        })  # fmt: skip
    return {
        "plots": plots,
        "figure_labels": c.labels,
        "figure_header": _header(c),
        "figure_rows": [_cells(row) for row in c.rows],
    }


def html_page(c: Comparison) -> str:
    """A self-contained HTML page: the table, then per user class the TTFT and per-token ITL
    CDFs of every run overlaid (plotly.js inlined)."""
    parts = figure_page_parts(c)
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent / "_report")), autoescape=True
    )
    return env.get_template("compare.html.j2").render(
        labels=c.labels,
        runs=c.runs,
        header=parts["figure_header"],
        rows=parts["figure_rows"],
        plots=parts["plots"],
        plotly_js=Markup(plotly_js()),
    )
