"""The benchmarks' results as tables: one set of cells, rendered for a terminal (rich) or as
Markdown (bench/RESULTS.md), and as one JSON object."""

from __future__ import annotations

import json
import math
from typing import Any

from rich.table import Table

from harness.benchmarks._client_check import ClientBench
from harness.benchmarks._common import Verdict, jsonable
from harness.benchmarks._proxy_bench import ProxyBench

Cells = tuple[list[str], list[list[str]]]


def _n(value: float | None, fmt: str = ",.0f") -> str:
    return "-" if value is None or not math.isfinite(value) else format(value, fmt)


def client_cells(bench: ClientBench) -> Cells:
    """Headers and rows of the client table: one row per client, then ours (``zerowindow``)
    / vLLM's when both were measured."""
    headers = [
        "client", "events/s ceiling", "CPU µs/event", "CPU % at full speed",
        "server CPU % at full speed",
        f"ITL err p50 ms at {bench.offered_events_per_s:,.0f}/s",
        f"ITL err p99 ms at {bench.offered_events_per_s:,.0f}/s", "events/s paced",
        "CPU µs/event paced", "delay p99 ms paced", "failed",
    ]  # fmt: skip
    rows = [
        [
            f.client,
            _n(f.ceiling_events_per_s),
            _n(f.cpu_us_per_event, ".2f"),
            _n(f.cpu_pct_full_speed),
            _n(f.server_cpu_pct_full_speed),
            _n(f.itl_err_p50_ms, ".3f"),
            _n(f.itl_err_p99_ms, ".3f"),
            _n(f.paced_events_per_s),
            _n(f.paced_cpu_us_per_event, ".2f"),
            _n(f.delay_p99_ms, ".2f"),
            str(f.failed),
        ]  # fmt: skip
        for f in bench.clients.values()
    ]
    if any(v is not None for v in bench.ratios.values()):
        r = bench.ratios
        rows.append([
            "ours / vLLM", _n(r["ceiling_events_per_s"], ".2f"), _n(r["cpu_us_per_event"], ".2f"),
            "", "", "", _n(r["itl_err_p99_ms"], ".3g"), "", _n(r["paced_cpu_us_per_event"], ".2f"),
            "", "",
        ])  # fmt: skip
    return headers, rows


def proxy_cells(bench: ProxyBench) -> Cells:
    """Headers and rows of the proxy table: one row per proxy measured."""
    headers = [
        "proxy", "p50 ms", "p99 ms", "added p50 ms", "added p99 ms", "events/s ceiling",
        "CPU µs/event", "events per CPU-s", "x nginx events per CPU-s", "proxy CPU",
        "load CPU", "CPU µs/event paced", "KiB per stalled stream", "stalled cut",
        "events lost",
    ]  # fmt: skip
    rows = []
    for name, r in bench.proxies.items():
        to_nginx = bench.ratios_to_nginx.get(name, {}).get("events_per_cpu_s")
        if name == "nginx":
            to_nginx = 1.0
        rows.append([
            name, _n(r.p50_ms, ".2f"), _n(r.p99_ms, ".2f"), _n(r.added_p50_ms, ".2f"),
            _n(r.added_p99_ms, ".2f"), _n(r.events_per_s), _n(r.cpu_us_per_event, ".2f"),
            _n(r.events_per_cpu_s), _n(to_nginx, ".2f"), _n(r.proxy_cpu_util, ".0%"),
            _n(r.load_cpu_util, ".0%"), _n(r.paced_cpu_us_per_event, ".2f"),
            _n(r.rss_per_stalled_kib, ".1f"),
            "-" if r.stalled_cut is None else str(r.stalled_cut), str(r.events_lost),
        ])  # fmt: skip
    return headers, rows


def verdict_lines(verdicts: list[Verdict]) -> list[str]:
    """One line per target: met, missed, or not measured and why."""
    out = []
    for v in verdicts:
        if v.met is None:
            out.append(f"{v.target}: not measured ({v.reason})")
        else:
            out.append(
                f"{v.target}: {_n(v.value, '.2f')} against {_n(v.threshold, '.2f')}: "
                + ("met" if v.met else "missed")
            )
    return out


def skipped_lines(skipped: dict[str, str]) -> list[str]:
    return [f"{name} skipped: {why}" for name, why in skipped.items()]


def rich_table(cells: Cells, title: str) -> Table:
    headers, rows = cells
    table = Table(title=title)
    for i, h in enumerate(headers):
        table.add_column(h, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*row)
    return table


def markdown_table(cells: Cells) -> list[str]:
    headers, rows = cells
    return [
        "| " + " | ".join(headers) + " |",
        "| --- |" + " ---: |" * (len(headers) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def to_json(bench: ClientBench | ProxyBench) -> str:
    """One JSON object with every figure (NaN as null)."""
    data: dict[str, Any] = jsonable(bench)
    data["targets_met"] = targets_met(bench.verdicts)
    return json.dumps(data, indent=2)


def targets_met(verdicts: list[Verdict]) -> bool | None:
    """True when every target was met, False when one was missed, else None (one was not
    measured and none missed)."""
    if any(v.met is False for v in verdicts):
        return False
    return True if all(v.met for v in verdicts) else None
