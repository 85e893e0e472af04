"""``zerowindow bench client`` and ``zerowindow bench proxy``: self-checks of the toolkit's
load client and egress buffer on this machine (``harness.benchmarks``), as a table or JSON;
``zerowindow bench gates``: seeded A/A and A/B trials of a scenario's gates."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

from harness._cli_errors import fail, setup_errors
from harness.benchmarks import (
    CLIENTS,
    PROXY_NAMES,
    BenchInterrupted,
    ClientBench,
    ProxyBench,
    ProxyWorkload,
    client_cells,
    interruptible,
    proxy_cells,
    rich_table,
    run_client_bench,
    run_proxy_bench,
    skipped_lines,
    targets_met,
    to_json,
    verdict_lines,
)
from harness.lifecycle import EXIT_FAILED, EXIT_INTERRUPTED, run_gate_trials
from harness.scenario import load_scenario

bench_app = typer.Typer(
    help="Self-checks: measure the load client and the egress buffer on this machine.",
    no_args_is_help=True,
)

JsonOption = Annotated[bool, typer.Option("--json", help="one JSON object on stdout")]
StrictOption = Annotated[
    bool,
    typer.Option(
        "--strict",
        help="exit 1 when a target is missed or could not be measured (a client or proxy "
        "to compare with skipped); default: exit 0",
    ),
]


def _progress(line: str) -> None:
    typer.echo(f"bench: {line}", err=True)


def _names(value: str, option: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in value.split(",") if n.strip())
    if not names:
        fail("invalid argument", f"{option}: give at least one name")
    return names


def _finish(bench: ClientBench | ProxyBench, as_json: bool, strict: bool, title: str) -> None:
    if as_json:
        typer.echo(to_json(bench))
    else:
        from rich.console import Console

        console = Console(width=None if sys.stdout.isatty() else 200)
        cells = client_cells(bench) if isinstance(bench, ClientBench) else proxy_cells(bench)
        console.print(rich_table(cells, title))
        for line in [*skipped_lines(bench.skipped), *bench.notes]:
            console.print(line, markup=False)
        console.print("Targets:", markup=False)
        for line in verdict_lines(bench.verdicts):
            console.print(f"- {line}", markup=False)
        m = bench.machine
        console.print(
            f"Machine: {m.cpus} CPUs ({m.cpus_allowed} allowed), load average "
            f"{m.load_avg_before[0]:.2f} before and {m.load_avg_after[0]:.2f} after (1 min). "
            f"Command: {bench.command}",
            markup=False,
        )
    if strict and targets_met(bench.verdicts) is not True:
        raise typer.Exit(EXIT_FAILED)


@bench_app.command("client")
def bench_client(
    as_json: JsonOption = False,
    clients: Annotated[
        str,
        typer.Option(
            help="comma-separated: zerowindow (kernel arrival stamps, as a run reads), "
            "zerowindow-read (stamped when recv returns), vllm (skipped if not installed)"
        ),
    ] = ",".join(CLIENTS),
    streams: Annotated[int, typer.Option(min=1, help="concurrent streams")] = 100,
    events: Annotated[int, typer.Option(min=2, help="chunks per stream at full speed")] = 2000,
    paced_events: Annotated[
        int, typer.Option(min=2, help="chunks per stream at the paced workload")
    ] = 1000,
    interval_ms: Annotated[
        float, typer.Option(min=0.1, help="ms between a stream's chunks, paced workload")
    ] = 5.0,
    strict: StrictOption = False,
) -> None:
    """Our load client (one Locust process with the toolkit's locustfile) beside vLLM's
    benchmark client: events/s ceiling and CPU µs per event at full speed, ITL error at
    STREAMS x INTERVAL_MS (100 x 5 ms: 20,000 offered events/s), and the targets (docs/bench.md).

    Exit code: 0 measured (targets met or not; --strict: 1 unless every one was met), 2 a
    tool is missing or a client failed, 130 interrupted."""
    try:
        with setup_errors("cannot run the client benchmark"), interruptible():
            bench = run_client_bench(
                clients=_names(clients, "--clients"), streams=streams, events=events,
                paced_events=paced_events, interval_ms=interval_ms, progress=_progress,
            )  # fmt: skip
    except BenchInterrupted as exc:
        typer.echo(f"interrupted ({exc}); every process the benchmark started is stopped", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _finish(bench, as_json, strict, "zerowindow bench client")


@bench_app.command("proxy")
def bench_proxy(
    as_json: JsonOption = False,
    proxies: Annotated[
        str,
        typer.Option(
            help="comma-separated, of " + ", ".join(PROXY_NAMES) + " (none, the direct path, "
            "is always measured; one not installed is skipped)"
        ),
    ] = ",".join(PROXY_NAMES),
    streams: Annotated[int, typer.Option(min=1, help="concurrent streams")] = 64,
    rate: Annotated[float, typer.Option(min=1, help="events/s per paced stream")] = 50.0,
    duration_s: Annotated[float, typer.Option(min=0.1, help="of each paced trial")] = 10.0,
    repeats: Annotated[int, typer.Option(min=1, help="paced trials per proxy")] = 3,
    flood_events: Annotated[
        int, typer.Option(min=1, help="events per stream in the saturation phase")
    ] = 5000,
    event_bytes: Annotated[int, typer.Option(min=48, help="bytes per SSE event")] = 200,
    stalled: Annotated[int, typer.Option(min=1, help="stalled streams")] = 200,
    stalled_kib: Annotated[int, typer.Option(min=1, help="KiB sent to each stalled stream")] = 128,
    strict: StrictOption = False,
) -> None:
    """The egress buffer beside nginx, HAProxy and Envoy on one SSE workload: added latency
    p50/p99, events/s ceiling, CPU µs per event and events per CPU-second, memory per stalled
    stream, ratios against nginx, and the targets (docs/bench.md).

    Exit code: 0 measured (targets met or not; --strict: 1 unless every one was met), 2 a
    tool is missing or a proxy failed, 130 interrupted."""
    workload = ProxyWorkload(
        streams=streams, rate=rate, duration_s=duration_s, repeats=repeats,
        flood_events=flood_events, event_bytes=event_bytes, stalled=stalled,
        stalled_kib=stalled_kib,
    )  # fmt: skip
    try:
        with setup_errors("cannot run the proxy benchmark"), interruptible():
            bench = run_proxy_bench(_names(proxies, "--proxies"), workload, progress=_progress)
    except BenchInterrupted as exc:
        typer.echo(f"interrupted ({exc}); every process the benchmark started is stopped", err=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    _finish(bench, as_json, strict, "zerowindow bench proxy")


@bench_app.command("gates")
def bench_gates(
    baseline: Annotated[Path, typer.Argument(help="the baseline scenario (TOML), also the A/A")],
    candidate: Annotated[Path, typer.Argument(help="the candidate scenario (TOML): A/B")],
    trials: Annotated[int, typer.Option(min=1, help="seeded trials of each experiment")] = 20,
    first_seed: Annotated[int, typer.Option(help="seed of the first trial")] = 0,
    out: Annotated[Path, typer.Option(help="folder of the trials' runs")] = Path(
        "results/gate-trials"
    ),
    as_json: JsonOption = False,
) -> None:
    """Do the gates flake, do they miss? For each seeded trial: run BASELINE and save it as a
    baseline, then gate BASELINE again (A/A: no gate may fail) and CANDIDATE (A/B: its gates
    should fail) against it (docs/gates.md). Prints, per experiment, the trials whose gates
    failed and each gate's verdicts.

    Exit code: 0 measured (whatever the counts), 2 a scenario is invalid."""
    with setup_errors("invalid scenario", scenario=baseline):
        base = load_scenario(baseline)
    with setup_errors("invalid scenario", scenario=candidate):
        cand = load_scenario(candidate)
    with setup_errors("cannot run the trials", scenario=baseline):
        result = run_gate_trials(
            base, cand, trials=trials, out_root=out, first_seed=first_seed, progress=_progress
        )
    data = {
        "command": f"zerowindow bench gates {baseline} {candidate} --trials {trials} "
        f"--first-seed {first_seed}",
        "A/A": result.same.as_dict(),
        "A/B": result.changed.as_dict(),
        "errors": result.errors,
    }
    if as_json:
        typer.echo(json.dumps(data, indent=2))
        return
    for name, exp in (("A/A (same settings)", result.same), ("A/B (candidate)", result.changed)):
        typer.echo(f"{name}: a gate failed in {exp.failed} of {exp.trials} trials")
        for gate, counts in exp.verdicts.items():
            typer.echo(f"  {gate}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    for line in result.errors:
        typer.echo(f"not judged: {line}", err=True)
