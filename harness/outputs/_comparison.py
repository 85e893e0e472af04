"""The proxy comparison written and printed: ``comparison.md``, ``comparison.json`` and a rich
table (the figures are :mod:`harness.analysis`'s)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from harness.analysis._comparison import Comparison
from harness.outputs._format import fmt_number
from harness.runfolder import COMPARISON_JSON, COMPARISON_MD

_GROUP_HEADERS = {
    "configuration": "config", "group": "group", "requests": "n", "outcomes": "outcomes",
    "ttft_p50_ms": "TTFT p50", "ttft_p99_ms": "TTFT p99", "itl_p50_ms": "ITL p50",
    "itl_p99_ms": "ITL p99", "inter_chunk_p50_ms": "gap p50", "inter_chunk_p99_ms": "gap p99",
    "inter_chunk_mean_ms": "gap mean",
    "stalled": "stalled", "cut_seen": "cut seen", "cut_rst": "RST",
    "stall_to_cut_p50_ms": "stall->cut p50", "stall_to_cut_max_ms": "stall->cut max",
    "engine_aborted": "aborted", "stall_to_abort_p50_ms": "stall->abort p50",
    "stall_to_abort_max_ms": "stall->abort max",
}  # fmt: skip
_CONFIG_HEADERS = {
    "configuration": "config", "kind": "kind", "status": "status",
    "generation_tokens": "generated tok", "undelivered_tokens": "wasted tok",
    "undelivered_tokens_per_stalled": "wasted/stalled", "kv_cache_usage_peak_perc": "KV peak %",
    "preemptions": "preempt", "proxy_rss_peak_bytes": "proxy RSS peak",
    "proxy_buffered_peak_bytes": "buffered peak", "stream_buffered_peak_mean_bytes":
    "stream buf mean", "client_send_q_peak_bytes": "client Send-Q pk",
    "upstream_recv_q_peak_bytes": "upstream Recv-Q pk", "proxy_cuts": "cuts",
    "proxy_upstream_aborts": "upstream aborts",
}  # fmt: skip


def _table_rows(frame: pd.DataFrame) -> list[list[str]]:
    return [[fmt_number(v, 1) for v in row] for row in frame.astype(object).itertuples(index=False)]


def to_markdown(comparison: Comparison, *, title: str) -> str:
    """The comparison as a Markdown document (two tables and the verdict lines)."""
    lines = [f"# {title}", "", "Latencies in ms (ITL per token; gap = inter-chunk latency); "
             "stall->cut: stall onset to the client seeing RST/FIN; stall->abort: to the "
             "engine's abort (estimate, one scrape interval); wasted tok: output tokens the "
             "engine generated that no client received; sizes in bytes.", ""]  # fmt: skip
    for frame, headers in ((comparison.groups, _GROUP_HEADERS),
                           (comparison.configurations, _CONFIG_HEADERS)):  # fmt: skip
        cols = [headers[c] for c in frame.columns]
        lines.append("| " + " | ".join(cols) + " |")
        lines.append("|" + "---|" * len(cols))
        lines += ["| " + " | ".join(r) + " |" for r in _table_rows(frame)]
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
    for frame, headers, name in (
        (comparison.groups, _GROUP_HEADERS, "per configuration and user group"),
        (comparison.configurations, _CONFIG_HEADERS, "per configuration"),
    ):
        table = Table(title=f"{title}: {name}", title_justify="left")
        for c in frame.columns:
            left = c in ("configuration", "group", "outcomes", "kind", "status")
            table.add_column(headers[c], justify="left" if left else "right", overflow="fold")
        for row in _table_rows(frame):
            table.add_row(*row)
        console.print(table)
    console.print("[dim]latencies in ms; ITL per token; gap = inter-chunk latency; sizes in "
                  "bytes; wasted tok = generated but never received[/dim]")  # fmt: skip
    for d in comparison.distortion:
        style = "bold yellow" if d["status"] == "buffering" else "dim"
        console.print(f"[{style}]{d['line']}[/{style}]")
