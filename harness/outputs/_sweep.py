"""A sweep's outputs: ``sweep.json`` (its figures and one row per run), ``sweep.md`` (the
table), ``sweep.html`` (the table and the figures against the rate, plotly.js inlined) and
the console table. They take the sweep as the plain dict of
``harness.analysis.SweepTable.as_dict``."""

from __future__ import annotations

import html
import json
import sys
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots
from rich.console import Console
from rich.table import Table

from harness.outputs._format import fmt_number
from harness.outputs._report import fragment, plotly_js
from harness.runfolder import SWEEP_JSON

SWEEP_MD, SWEEP_HTML = "sweep.md", "sweep.html"
COLUMNS = [  # (key, header)
    ("label", "run"),
    ("offered_rps", "offered req/s"),
    ("sent_rps", "sent req/s"),
    ("completed_rps", "completed req/s"),
    ("goodput_rps", "goodput req/s"),
    ("max_concurrency", "ceiling"),
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p99_ms", "TTFT p99"),
    ("itl_p50_ms", "ITL p50"),
    ("itl_p99_ms", "ITL p99"),
    ("output_tokens_per_s", "output tok/s"),
    ("kv_cache_usage_peak_perc", "KV peak %"),
    ("preemptions", "preempt"),
    ("status", "status"),
    ("gates_passed", "gates"),
]
NOTE = (
    "latencies in ms, from each request's scheduled send at a rate, from its send in the "
    "serial, throughput and ceiling runs (all at once); ITL per token; serial: one request "
    "at a time; throughput: all at once"
)


def _cell(key: str, value: Any) -> str:
    if key == "gates_passed":
        return "-" if value is None else ("pass" if value else "FAIL")
    if isinstance(value, float | int) and not isinstance(value, bool):
        return fmt_number(float(value))
    return "-" if value is None else str(value)


def _rows(sweep: dict[str, Any]) -> list[list[str]]:
    return [[_cell(k, p.get(k)) for k, _ in COLUMNS] for p in sweep["points"]]


def _headline(sweep: dict[str, Any]) -> str:
    parts = [
        f"capacity {fmt_number(sweep['capacity_rps'])} req/s (throughput run)",
        f"kept up to {fmt_number(sweep['kept_up_rps'])} req/s offered",
    ]
    searched = [p for p in sweep["points"] if p["phase"] == "sla"]
    if any(p["max_concurrency"] is not None for p in searched):
        parts.append(
            f"highest concurrency passing the gates {fmt_number(sweep['sla_concurrency'])}"
        )
    elif searched:
        parts.append(f"highest rate passing the gates {fmt_number(sweep['sla_rps'])} req/s")
    if slo := sweep.get("goodput_slo_ms"):
        parts.append("goodput: " + ", ".join(f"{k} <= {v:g} ms" for k, v in slo.items()))
    return "; ".join(parts)


def to_markdown(sweep: dict[str, Any], *, title: str) -> str:
    """The sweep's table as Markdown, its headline first."""
    lines = [f"# Sweep: {title}", "", _headline(sweep), ""]
    lines.append("| " + " | ".join(h for _, h in COLUMNS) + " |")
    lines.append("|" + "|".join(" --- " for _ in COLUMNS) + "|")
    lines += ["| " + " | ".join(r) + " |" for r in _rows(sweep)]
    return "\n".join([*lines, "", NOTE, ""])


def figure(sweep: dict[str, Any]) -> go.Figure:
    """TTFT and ITL p50/p99, completed requests/s and output tokens/s, KV peak and
    preemptions, against the rate of each run (offered; the serial and throughput runs at the
    rate they completed)."""
    pts = sorted(
        (p for p in sweep["points"] if (p["offered_rps"] or p["completed_rps"]) is not None),
        key=lambda p: p["offered_rps"] or p["completed_rps"],
    )
    x = [p["offered_rps"] or p["completed_rps"] for p in pts]
    fig = make_subplots(
        rows=2, cols=2, horizontal_spacing=0.08, vertical_spacing=0.14,
        subplot_titles=("TTFT (ms)", "ITL per token (ms)", "throughput", "KV and preemptions"),
    )  # fmt: skip

    def line(key: str, name: str, row: int, col: int) -> None:
        fig.add_trace(
            go.Scatter(x=x, y=[p[key] for p in pts], name=name, mode="lines+markers",
                       text=[p["label"] for p in pts]),
            row=row, col=col,
        )  # fmt: skip

    line("ttft_p50_ms", "TTFT p50", 1, 1)
    line("ttft_p99_ms", "TTFT p99", 1, 1)
    line("itl_p50_ms", "ITL p50", 1, 2)
    line("itl_p99_ms", "ITL p99", 1, 2)
    line("completed_rps", "completed req/s", 2, 1)
    if any(p["goodput_rps"] is not None for p in pts):
        line("goodput_rps", "goodput req/s", 2, 1)
    line("output_tokens_per_s", "output tok/s", 2, 1)
    line("kv_cache_usage_peak_perc", "KV peak %", 2, 2)
    line("preemptions", "preemptions", 2, 2)
    fig.update_xaxes(title_text="requests/s")
    fig.update_layout(height=720, margin={"t": 40, "l": 50, "r": 20, "b": 40})
    return fig


def sweep_fragment(sweep: dict[str, Any]) -> str:
    """The sweep for a page that inlines plotly.js: the headline, :func:`figure` and the
    table."""
    head = "".join(f"<th>{html.escape(h)}</th>" for _, h in COLUMNS)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
        for row in _rows(sweep)
    )
    return (
        f"<p>{html.escape(_headline(sweep))}</p>{fragment(figure(sweep), 'sweep')}"
        f"<table><tr>{head}</tr>{body}</table><p class='sub'>{html.escape(NOTE)}</p>"
    )


def html_page(sweep: dict[str, Any], *, title: str) -> str:
    """A self-contained page: the headline, the table and :func:`figure`."""
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>zerowindow sweep: {html.escape(title)}</title><style>"
        "body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1400px;padding:0 20px}"
        "table{border-collapse:collapse}th,td{border:1px solid #ddd;padding:2px 8px;"
        "text-align:right}th{background:#f5f5f5}.sub{color:#666}</style>"
        f"<script type='text/javascript'>{plotly_js()}</script></head><body>"
        f"<h1>Sweep: {html.escape(title)}</h1>{sweep_fragment(sweep)}</body></html>"
    )


def write_sweep(sweep: dict[str, Any], run_dir: Path, *, title: str) -> None:
    """Write ``sweep.json``, ``sweep.md`` and ``sweep.html`` into ``run_dir``."""
    (run_dir / SWEEP_JSON).write_text(json.dumps(sweep, indent=2) + "\n")
    (run_dir / SWEEP_MD).write_text(to_markdown(sweep, title=title))
    (run_dir / SWEEP_HTML).write_text(html_page(sweep, title=title))


def print_sweep(sweep: dict[str, Any], *, title: str, console: Console | None = None) -> None:
    """The sweep's table on the console, its headline under it."""
    table = Table(title=f"sweep: {title}", title_justify="left")
    for _, header in COLUMNS:
        table.add_column(header, justify="left" if header in ("run", "status") else "right")
    for row in _rows(sweep):
        table.add_row(*row)
    out = console or Console(width=None if sys.stdout.isatty() else 200)
    out.print(table)
    out.print(_headline(sweep))
    out.print(NOTE)
