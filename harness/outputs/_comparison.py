"""The proxy comparison written and printed: ``comparison.md``, ``comparison.json`` and a rich
table (the figures are :mod:`harness.analysis`'s)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table

from harness.analysis import Comparison
from harness.outputs._format import fmt_number
from harness.runfolder import COMPARISON_JSON, COMPARISON_MD

GROUP_HEADERS = {
    "configuration": "config", "group": "group", "requests": "n", "outcomes": "outcomes",
    "ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "itl_p50_ms": "ITL p50",
    "itl_p99_ms": "ITL p99", "inter_chunk_p50_ms": "gap p50", "inter_chunk_p99_ms": "gap p99",
    "inter_chunk_mean_ms": "gap mean",
    "stalled": "stalled", "cut_seen": "cut seen", "cut_rst": "RST",
    "stall_to_cut_p50_ms": "stall->cut p50", "stall_to_cut_max_ms": "stall->cut max",
    "engine_aborted": "aborted", "stall_to_abort_p50_ms": "stall->abort p50",
    "stall_to_abort_max_ms": "stall->abort max",
}  # fmt: skip
CONFIG_HEADERS = {
    "configuration": "config", "kind": "kind", "status": "status",
    "generation_tokens": "generated tok", "undelivered_tokens": "wasted tok",
    "undelivered_tokens_per_stalled": "wasted/stalled", "kv_cache_usage_peak_perc": "KV peak %",
    "preemptions": "preempt", "proxy_rss_peak_bytes": "proxy RSS peak",
    "proxy_buffered_peak_bytes": "buffered peak", "stream_buffered_peak_mean_bytes":
    "stream buf mean", "client_send_q_peak_bytes": "client Send-Q pk",
    "upstream_recv_q_peak_bytes": "upstream Recv-Q pk", "proxy_cuts": "cuts",
    "proxy_upstream_aborts": "upstream aborts",
}  # fmt: skip


def table_rows(rows: Iterable[Iterable[Any]]) -> list[list[str]]:
    """Cells as text: floats with one decimal, ``-`` for none."""
    return [[fmt_number(v, 1) for v in row] for row in rows]


def _frame_rows(frame: pd.DataFrame) -> list[list[str]]:
    return table_rows(frame.astype(object).itertuples(index=False))


def _group_rows(comparison: Comparison) -> list[list[str]]:
    """The per-group rows, each latency with its interval where the comparison has one."""
    frame = comparison.groups
    cols = list(frame.columns)
    out = []
    for raw, cells in zip(frame.astype(object).itertuples(index=False),
                          _frame_rows(frame), strict=True):  # fmt: skip
        config, group = raw[0], raw[1]
        for i, col in enumerate(cols):
            span = comparison.interval(str(config), f"{group}.{col}")
            if span is not None and cells[i] != "-":
                cells[i] += f" [{fmt_number(span[0], 1)}, {fmt_number(span[1], 1)}]"
        out.append(cells)
    return out


def _tables(comparison: Comparison) -> list[tuple[pd.DataFrame, dict[str, str], list[list[str]]]]:
    return [
        (comparison.groups, GROUP_HEADERS, _group_rows(comparison)),
        (comparison.configurations, CONFIG_HEADERS, _frame_rows(comparison.configurations)),
    ]


def to_markdown(comparison: Comparison, *, title: str) -> str:
    """The comparison as a Markdown document (two tables and the verdict lines)."""
    lines = [f"# {title}", "", "Latencies in ms (ITL per token; gap = inter-chunk latency); "
             "stall->cut: stall onset to the client seeing RST/FIN; stall->abort: to the "
             "engine's abort (estimate, one scrape interval); wasted tok: output tokens the "
             "engine generated that no client received; sizes in bytes.", ""]  # fmt: skip
    repeats = comparison.repeats
    if any(n > 1 for n in repeats.values()):
        lines += ["Each configuration's figures are over its repeats ("
                  + ", ".join(f"{k} {v}" for k, v in repeats.items())
                  + "), with their intervals in brackets.", ""]  # fmt: skip
    for frame, headers, rows in _tables(comparison):
        cols = [headers[c] for c in frame.columns]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        lines.append("")
    lines.append("## Buffering distortion")
    lines.append("")
    lines += [f"- {d['line']}" for d in comparison.distortion] or ["- (nothing to compare)"]
    return "\n".join(lines) + "\n"


def write_comparison(comparison: Comparison, run_dir: Path, *, title: str) -> None:
    """Write ``comparison.json`` and ``comparison.md`` into ``run_dir``."""
    (run_dir / COMPARISON_JSON).write_text(
        json.dumps(comparison.as_dict(), indent=2, default=str) + "\n"
    )
    (run_dir / COMPARISON_MD).write_text(to_markdown(comparison, title=title))


def print_comparison(comparison: Comparison, *, title: str, console: Console | None = None) -> None:
    """Print the comparison with rich: the per-group table, the per-configuration table, and
    the buffering verdicts."""
    console = console or Console(width=200)
    names = ("per configuration and user group", "per configuration")
    for (frame, headers, rows), name in zip(_tables(comparison), names, strict=True):
        table = Table(title=f"{title}: {name}", title_justify="left")
        for c in frame.columns:
            left = c in ("configuration", "group", "outcomes", "kind", "status")
            table.add_column(headers[c], justify="left" if left else "right", overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    console.print("[dim]latencies in ms; ITL per token; gap = inter-chunk latency; sizes in "
                  "bytes; wasted tok = generated but never received[/dim]")  # fmt: skip
    for d in comparison.distortion:
        style = "bold yellow" if d["status"] == "buffering" else "dim"
        console.print(f"[{style}]{d['line']}[/{style}]")
