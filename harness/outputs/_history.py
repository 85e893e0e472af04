"""``zerowindow history show``: a scenario's runs and trends, on the console, as Markdown for
the CI step summary, and as ``history.html`` (one plotly chart per figure and series: values
with their intervals as a band, commits on hover, change points marked, gate bounds drawn).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd
import plotly.graph_objects as go
from markupsafe import Markup
from rich.console import Console
from rich.table import Table

from harness.history import MIN_RUNS, FigureTrend, series_label
from harness.outputs._report import fragment, plotly_js

HISTORY_HTML = "history.html"
PAGE_RUNS = 50  # the runs listed on the page, newest first


def _points_text(trend: FigureTrend) -> str:
    if len(trend.runs) < MIN_RUNS:
        return f"not looked for: {len(trend.runs)} run(s), {MIN_RUNS} needed"
    if not trend.points:
        return "none"
    return "; ".join(
        f"run {p.index + 1}: {p.change * 100:+.1f}% [{p.low * 100:+.1f}, {p.high * 100:+.1f}], "
        f"p={p.p_value:.2g}"
        for p in trend.points
    )


def provenance_row(entry: pd.Series) -> dict[str, str]:
    """One entry's provenance for a person: when, configuration, outcome, the scenario's
    content (a hash: it changes when the scenario file does), commit, toolkit, target, model,
    machine."""
    prov: dict[str, Any] = entry["provenance"]
    key: dict[str, Any] = entry["series_key"]
    versions = prov.get("versions", {})
    engine = ", ".join(f"{k} {v}" for k, v in key.get("engine", {}).items())
    return {
        "started (UTC)": str(entry["started_utc"])[:19],
        "configuration": str(entry["arm"]),
        "status": f"{entry['status']} (exit {entry['exit_code']})",
        "repeats": str(entry["repeats"]),
        "scenario": str(entry["scenario_hash"])[:8],
        "commit": str(entry["commit_sha"] or "-")[:12],
        "zerowindow": str(versions.get("zerowindow", "-")),
        "target": f"{key.get('target_kind')} {engine}".strip(),
        "model": str(key.get("model")),
        "machine": str(prov.get("host", {}).get("hostname", "-")),
        "accelerator": ", ".join(key.get("accelerator") or []) or "none",
    }


def print_history(entries: pd.DataFrame, trends: Sequence[FigureTrend],
                  console: Console | None = None) -> None:  # fmt: skip
    """The entries with their provenance, then one row per figure and series."""
    # Piped (CI logs): wide enough for the provenance table, not the 80 columns of a pipe.
    console = console or Console(width=None if sys.stdout.isatty() else 200)
    rows = [provenance_row(e) for _, e in entries.iterrows()]
    table = Table(title=f"{len(rows)} run(s) in the history")
    for column in rows[0] if rows else []:
        table.add_column(column)
    for row in rows:
        table.add_row(*row.values())
    console.print(table)
    for series in dict.fromkeys(t.series for t in trends):
        of = [t for t in trends if t.series == series]
        table = Table(title=f"series {series}: {series_label(of[0].series_key)}")
        for column in ("figure", "runs", "newest", "change points (Otava)"):
            table.add_column(column)
        for t in of:
            table.add_row(t.figure, str(len(t.runs)), f"{t.runs['value'].iloc[-1]:.6g}",
                          _points_text(t))  # fmt: skip
        console.print(table)


def history_markdown(scenario: str, trends: Sequence[FigureTrend]) -> str:
    """The trend table as Markdown (GitHub's job summary)."""
    lines = [
        f"### zerowindow history: {scenario}",
        "",
        "| figure | series | runs | newest | change points |",
        "|---|---|---|---|---|",
    ]
    for t in trends:
        newest = t.runs["value"].iloc[-1]
        label = series_label(t.series_key).replace("|", "/")
        lines.append(f"| `{t.figure}` | {label} | {len(t.runs)} | {newest:.6g} | "
                     f"{_points_text(t)} |")  # fmt: skip
    return "\n".join(lines) + "\n"


def trend_figure(trend: FigureTrend) -> go.Figure:
    """One figure over its series: the values (hover: time, commit, CI run, folder), their
    intervals as a band where measured over repeats, each change point a dashed line with
    its size and p-value, and the bound of an absolute gate on the figure."""
    runs = trend.runs
    x = list(range(1, len(runs) + 1))
    hover = [
        f"run {i}<br>{str(r.started_utc)[:19]}<br>commit {str(r.commit_sha or '-')[:12]}"
        f"<br>CI run {r.ci_run_id or '-'!s}<br>{r.status!s}, repeats {r.repeats!s}<br>{r.folder!s}"
        for i, r in zip(x, runs.itertuples(), strict=True)
    ]
    fig = go.Figure()
    if runs["low"].notna().any():
        fig.add_trace(go.Scatter(x=x + x[::-1], y=list(runs["high"]) + list(runs["low"])[::-1],
                                 fill="toself", fillcolor="rgba(31,119,180,0.15)",
                                 line={"width": 0}, name="interval", hoverinfo="skip"))  # fmt: skip
    fig.add_trace(
        go.Scatter(x=x, y=runs["value"], mode="lines+markers", name=trend.figure, text=hover,
                   hovertemplate="%{y:.6g}<br>%{text}<extra></extra>")
    )  # fmt: skip
    low, high = _y_range(runs)
    bound = runs["bound"].dropna()
    if len(bound) and low <= float(bound.iloc[-1]) <= high:  # a far bound would flatten the data
        fig.add_trace(go.Scatter(x=x, y=runs["bound"], mode="lines", name="gate bound",
                                 line={"dash": "dot", "color": "#c62828"}))  # fmt: skip
    title = f"{trend.figure} (worse when {trend.direction})"
    if len(bound):
        title += f"; gate bound {float(bound.iloc[-1]):.6g}"
    for p in trend.points:
        fig.add_vline(x=p.index + 0.5, line_dash="dash", line_color="#ef6c00",
                      annotation_text=f"{p.change * 100:+.1f}%, p={p.p_value:.2g}",
                      annotation_position="top left")  # fmt: skip
    fig.update_layout(
        title=title, height=320, margin={"l": 60, "r": 20, "t": 50, "b": 40},
        xaxis_title="run", showlegend=False, yaxis={"range": [low, high]},
        xaxis={"tickformat": "d", "dtick": max(1, len(runs) // 10)},
    )  # fmt: skip
    return fig


def _y_range(runs: pd.DataFrame) -> tuple[float, float]:
    """The values (and their intervals), padded, and never narrower than 10 % of their mean
    around it: a chart of a steady figure shows it steady, not its noise magnified."""
    values = pd.concat([runs["value"], runs["low"], runs["high"]]).dropna()
    lo, hi = float(values.min()), float(values.max())
    middle, half = (lo + hi) / 2, max((hi - lo) / 2 * 1.15, abs(float(runs["value"].mean())) * 0.05)
    return middle - half, middle + half


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>zerowindow history {{ scenario }}</title>
<style>
 body { font: 14px/1.45 system-ui, sans-serif; margin: 0 auto; max-width: 1400px;
        padding: 0 20px 40px; color: #222; }
 table { border-collapse: collapse; margin: 6px 0 14px; }
 th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; }
 th { background: #f5f5f5; } h2 { font-size: 17px; margin-top: 22px; }
</style><script>{{ plotly_js }}</script></head><body>
<h1>zerowindow history: {{ scenario }}</h1>
<p>{{ total }} run(s); change points by Apache Otava
 (E-divisive, t-test p &lt; {{ max_pvalue }}).</p>
<table><tr><th>figure</th><th>series</th><th>runs</th><th>newest</th><th>change points</th></tr>
{% for t in table %}<tr>{% for cell in t %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</table>
{% for label, charts in series %}<h2>{{ label }}</h2>
{% for chart in charts %}<div class="trend">{{ chart }}</div>{% endfor %}{% endfor %}
{% if not series %}<p>No figure matched.</p>{% endif %}
<h2>The runs{% if rows | length < total %} (the newest {{ rows | length }}){% endif %}</h2>
<table><tr>{% for c in columns %}<th>{{ c }}</th>{% endfor %}</tr>
{% for r in rows %}<tr>{% for c in columns %}<td>{{ r[c] }}</td>{% endfor %}</tr>
{% endfor %}</table>
</body></html>
"""


def render_history(
    scenario: str, entries: pd.DataFrame, trends: Sequence[FigureTrend], *, max_pvalue: float
) -> str:
    """The history page (module docstring); it inlines plotly.js and opens offline."""
    rows = [provenance_row(e) for _, e in entries.tail(PAGE_RUNS).iloc[::-1].iterrows()]
    table = [(t.figure, series_label(t.series_key), len(t.runs),
              f"{t.runs['value'].iloc[-1]:.6g}", _points_text(t)) for t in trends]  # fmt: skip
    series: dict[str, list[Markup]] = {}
    for i, t in enumerate(trends):
        chart = Markup(fragment(trend_figure(t), f"trend-{i}"))  # noqa: S704 (plotly's HTML)
        series.setdefault(series_label(t.series_key), []).append(chart)
    env = jinja2.Environment(autoescape=True)
    return env.from_string(_PAGE).render(
        scenario=scenario, rows=rows, columns=list(rows[0]) if rows else [], table=table,
        total=len(entries),
        series=list(series.items()), plotly_js=Markup(plotly_js()),  # noqa: S704
        max_pvalue=max_pvalue,
    )  # fmt: skip


def write_history_page(
    folder: Path, scenario: str, entries: pd.DataFrame, trends: Sequence[FigureTrend],
    *, max_pvalue: float,
) -> Path:  # fmt: skip
    """Write ``folder/history.html`` and return its path. Raises ``OSError``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / HISTORY_HTML
    path.write_text(render_history(scenario, entries, trends, max_pvalue=max_pvalue))
    return path
