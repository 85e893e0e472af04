"""Terminal output of a run: one table per user group, one for the server, the verdict line."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.gates import GateResult
from harness.outputs._format import fmt_number as _f
from harness.outputs._matrix import print_matrix
from harness.runfolder import HopSummary, RunSummary


def print_summary(summary: RunSummary, *, run_dir: str, console: Console | None = None) -> None:
    """Print ``summary`` as tables; latencies in ms."""
    # Off a terminal rich assumes 80 columns, too narrow for the group table.
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    groups = Table(title=f"{summary.scenario}: user groups", title_justify="left")
    for col in (
        "group", "requests", "outcomes", "TTFT p50", "TTFT p90", "TTFT p99",
        "ITL p50", "ITL p99", "chunk gap p50", "chunk gap p99", "tokens/s",
    ):  # fmt: skip
        groups.add_column(col, justify="left" if col in ("group", "outcomes") else "right")
    for g in summary.groups:
        groups.add_row(
            g.group + (" (whole answers)" if g.whole_answers else ""),
            str(g.requests),
            ", ".join(f"{k} {v}" for k, v in sorted(g.outcomes.items())),
            _f(g.ttft_p50_ms, 1), _f(g.ttft_p90_ms, 1), _f(g.ttft_p99_ms, 1),
            _f(g.itl_p50_ms, 2), _f(g.itl_p99_ms, 2),
            _f(g.inter_chunk_p50_ms, 2), _f(g.inter_chunk_p99_ms, 2),
            _f(g.output_tokens_per_s, 1),
        )  # fmt: skip
    console.print(groups)
    console.print("[dim]latencies in ms; ITL per token; chunk gap = inter-chunk latency[/dim]")
    if any(g.whole_answers for g in summary.groups):
        console.print(
            "[dim]whole answers (stream = false): TTFT is the whole answer's arrival[/dim]"
        )
    s = summary.server
    source = (
        f"the engine's own {s.engine_steps:,} steps; scrapes saw peak KV "
        f"{_f(s.scraped_kv_cache_usage_peak_perc, 1)} %"
        if s.figures_source == "engine_probe" and s.engine_steps
        else f"from {s.scrapes} /metrics scrapes"
    )
    server = Table(title=f"server ({source})", title_justify="left")
    for col in ("peak KV usage %", "preemptions", "peak running", "peak waiting", "missing"):
        server.add_column(col, justify="right")
    server.add_row(
        _f(s.kv_cache_usage_peak_perc, 1),
        _f(s.preemptions, 0),
        _f(s.running_peak, 0),
        _f(s.waiting_peak, 0),
        ", ".join(s.missing_metrics) or "-",
    )
    console.print(server)
    print_matrix(summary.matrix, console)
    # Lines made of measured text are printed as they are: "[scrape-only: ...]" is no markup.
    console.print(summary.verdicts["kv_held_by_undelivered_streams"]["line"], markup=False)
    if costs := summary.verdicts.get("engine_costs"):
        console.print(costs["line"], markup=False)
    if summary.proxy is not None and summary.proxy.hops:
        console.print(hops_table(summary.proxy.hops))
    for w in summary.load_workers:
        if w.clock is not None:
            console.print(
                f"worker {w.worker} of group {w.group}: clock {w.clock.offset_s:+.6f} s from the "
                f"harness's, within {w.clock.bound_ms:.3f} ms ({w.clock.samples} pings); its "
                "times were moved onto the harness's clock",
                markup=False,
            )
    saturation = summary.client_saturation
    style = "bold yellow" if saturation.saturated else "dim"
    console.print(f"[{style}]{escape(saturation.message)}[/{style}]")
    if summary.failure:
        console.print(f"[bold red]run {summary.status}: {escape(summary.failure)}[/bold red]")
    console.print(f"results: {escape(run_dir)}")


def hops_table(hops: list[HopSummary], *, of: str = "") -> Table:
    """The proxy's hops, one row each (0 faces the clients): peak RSS (MB), peak Send-Q toward
    the hop in front or the clients (the largest connection, and summed over its connections),
    peak Recv-Q from its upstream (largest connection), peak buffered bytes and its own
    metrics' figures; ``of``: whose proxy (a configuration's name), in the title."""
    whose = f"{of}: " if of else ""
    title = f"{whose}proxy hops (0 faces the clients; peaks)"
    table = Table(title=title, title_justify="left")
    for col in (
        "hop", "kind", "port", "RSS MB", "Send-Q 1 conn B", "Send-Q all B", "upstream Recv-Q B",
        "buffered B", "own metrics",
    ):  # fmt: skip
        table.add_column(col, justify="left" if col in ("kind", "own metrics") else "right")
    for h in hops:
        rss = None if h.rss_peak_bytes is None else h.rss_peak_bytes / 1e6
        table.add_row(
            str(h.index), escape(h.kind), str(h.port), _f(rss, 1),
            _f(h.client_send_q_peak_bytes, 0), _f(h.send_q_peak_bytes, 0),
            _f(h.upstream_recv_q_peak_bytes, 0), _f(h.buffered_peak_bytes, 0),
            escape(", ".join(f"{k} {_f(v, 0)}" for k, v in h.metrics.items()) or "-"),
        )  # fmt: skip
    return table


def print_hops(runs: dict[str, RunSummary], console: Console | None = None) -> None:
    """The :func:`hops_table` of each run of ``runs`` (by name) whose proxy has several hops (a
    chain; a single proxy's figures are in the comparison's own table)."""
    console = console or Console(width=200)
    for name, summary in runs.items():
        if summary.proxy is not None and len(summary.proxy.hops) > 1:
            console.print(hops_table(summary.proxy.hops, of=name))


def print_gates(gates: list[GateResult], *, exit_code: int, console: Console | None = None) -> None:
    """Print the gate results (nothing when the scenario declares none) and the exit code."""
    if not gates:
        return
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="gates", title_justify="left")
    for col in ("", "gate", "reason"):
        table.add_column(col)
    for g in gates:
        mark = "[green]pass[/green]" if g.passed else "[bold red]FAIL[/bold red]"
        mark = "[yellow]warn[/yellow]" if g.passed and g.inconclusive else mark
        mark = "[yellow]skip[/yellow]" if g.skipped else mark
        table.add_row(mark, escape(g.gate), escape(g.reason))
    console.print(table)
    failed = sum(not g.passed for g in gates)
    skipped = sum(g.skipped for g in gates)
    style = "bold red" if failed else "green"
    note = f", {skipped} skipped" if skipped else ""
    console.print(
        f"[{style}]{len(gates) - failed - skipped} of {len(gates)} gates passed{note}"
        f"[/{style}] (exit {exit_code})"
    )
