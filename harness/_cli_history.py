"""``zerowindow history``: add run folders to the history, show a scenario's trends, check
them as gates (``harness.history``)."""

from __future__ import annotations

import fnmatch
import os
from datetime import datetime
from pathlib import Path
from typing import Annotated

import pandas as pd
import typer

from harness._cli_errors import fail, setup_errors
from harness.gates import GateResult, evaluate_gates
from harness.history import (
    HISTORY_ENV,
    HistoryStore,
    Past,
    add_folders,
    history_path,
    trends,
)
from harness.outputs import (
    JunitSuite,
    append_markdown,
    history_markdown,
    print_gates,
    print_history,
    write_history_page,
    write_junit,
)
from harness.scenario import Gate, GatingConfig, HistoryConfig, load_scenario, parse_gate

history_app = typer.Typer(
    help="The history of runs: add folders, show trends with change points, check them.",
    no_args_is_help=True,
)
HistoryOption = Annotated[
    Path | None,
    typer.Option(
        "--history",
        help=f"history file (default: ${HISTORY_ENV}, else the scenario's [history] path, "
        "else results/history.duckdb)",
    ),
]
NoHistoryOption = Annotated[
    bool,
    typer.Option("--no-history", help="add nothing to the history; history gates are skipped"),
]
FigureOption = Annotated[
    list[str] | None,
    typer.Option(
        "--figure", metavar="GLOB", help="figure name or glob (fast.*_p99_ms); repeatable"
    ),
]


def _store_path(option: Path | None, config: HistoryConfig | None = None) -> Path:
    path = history_path(option, True, config or HistoryConfig(), Path("results"))
    if path is None:
        fail("no history", f"${HISTORY_ENV} is {os.environ.get(HISTORY_ENV)!r}: history is off")
    return path


def _scenario(name_or_file: str) -> tuple[str, list[Gate], HistoryConfig | None]:
    """A scenario's name, its history gates and its [history], from a TOML file or a name."""
    path = Path(name_or_file)
    if path.suffix == ".toml" or path.is_file():
        with setup_errors("invalid scenario"):
            scenario = load_scenario(path)
        return scenario.name, [g for g in scenario.gates if g.history], scenario.history
    return name_or_file, [], None


@history_app.command("add")
def history_add(
    folders: Annotated[list[Path], typer.Argument(help="run, plan or suite folders, or results/")],
    history: HistoryOption = None,
) -> None:
    """Add run folders written earlier to the history. A run already there is left as it is."""
    path = _store_path(history)
    with setup_errors("cannot add to the history"):
        new, known, skipped = add_folders(path, folders)
    for line in skipped:
        typer.echo(f"skipped: {line}", err=True)
    typer.echo(f"{len(new)} entr{'y' if len(new) == 1 else 'ies'} added to {path}"
               f"{f', {known} already there' if known else ''}")  # fmt: skip


SinceOption = Annotated[
    str | None, typer.Option(help="only runs started on or after this date or time (2026-12-01)")
]


def _since(value: str | None) -> str | None:
    """``--since`` checked: an ISO date or date and time."""
    if value is None:
        return None
    try:
        datetime.fromisoformat(value)
    except ValueError:
        fail("invalid argument", f"--since {value!r}: expected a date such as 2026-12-01 "
             "or a time such as 2026-12-01T08:00")  # fmt: skip
    return value


def _entries(store: HistoryStore, path: Path, name: str, since: str | None) -> pd.DataFrame:
    """The runs of ``name``; exit 2 naming the scenarios there are when it has none."""
    entries = store.entries(name, since=since)
    if entries.empty:
        known = ", ".join(store.scenarios()) or "none"
        when = f" since {since}" if since and name in store.scenarios() else ""
        fail("no such runs", f"{path}: no run of {name!r}{when} (scenarios: {known})")
    return entries


@history_app.command("show")
def history_show(
    scenario: Annotated[str, typer.Argument(help="scenario name, or its TOML file")],
    figure: FigureOption = None,
    since: SinceOption = None,
    history: HistoryOption = None,
    out: Annotated[Path, typer.Option(help="folder that receives history.html")] = Path("."),
) -> None:
    """Print SCENARIO's runs with their provenance and each figure's trend per series (runs
    of another model, machine or engine version are a series of their own), with Otava's
    change points; write OUT/history.html. Appends the trend table to $GITHUB_STEP_SUMMARY
    when it is set."""
    name, _, config = _scenario(scenario)
    path, since = _store_path(history, config), _since(since)
    pvalue = GatingConfig().history_max_pvalue
    with setup_errors("cannot read the history"):
        with HistoryStore(path, read_only=True) as store:
            entries = _entries(store, path, name, since)
            found = trends(store, name, figures=figure or (), since=since, max_pvalue=pvalue)
    if figure and not found:
        fail("unknown figure", f"--figure {' '.join(figure)}: no such figure in {name}'s runs")
    print_history(entries, found)
    with setup_errors("cannot write the history page"):
        page = write_history_page(out, name, entries, found, max_pvalue=pvalue)
        append_markdown(history_markdown(name, found))
    typer.echo(f"history page: {page}")


def _check_gates(
    gates: list[Gate], figures: list[str], within: float, known: list[str]
) -> list[Gate]:
    """The scenario's history gates and one per figure matching ``figures`` (globs)."""
    out = list(gates)
    for pattern in figures:
        names = [n for n in known if fnmatch.fnmatchcase(n, pattern)]
        if not names:
            fail("unknown figure", f"--figure {pattern}: no such figure in the history")
        out += [parse_gate(f"{n} ~ history within {within:g}%") for n in names]
    return list({g.figure: g for g in out}.values())


def _before_last(values: list[float]) -> Past:
    """The past of a series' newest run: every value before it."""
    return lambda _figure: values[:-1]


@history_app.command("check")
def history_check(
    scenario: Annotated[str, typer.Argument(help="scenario name, or its TOML file")],
    figure: FigureOption = None,
    within: Annotated[
        float, typer.Option(help="tolerance (%) for --figure: a worse change beyond it fails")
    ] = 10.0,
    since: SinceOption = None,
    history: HistoryOption = None,
    junit: Annotated[
        Path | None,
        typer.Option(help="also write the verdicts as JUnit XML (one test suite a series)"),
    ] = None,
) -> None:
    """Judge SCENARIO's history gates ('FIGURE ~ history', from its TOML file or the gates its
    runs recorded) and --figure on each series' newest run, as a run would: fails when the
    newest runs lie after change points that worsen the figure beyond the tolerance.

    Exit code: 0 all pass, 1 one fails, 2 nothing to check or no such scenario."""
    name, gates, config = _scenario(scenario)
    path, since = _store_path(history, config), _since(since)
    suites: list[JunitSuite] = []
    with setup_errors("cannot read the history"):
        with HistoryStore(path, read_only=True) as store:
            entries = _entries(store, path, name, since)
            recorded = store.gates(list(entries["entry_id"]))
            gates += [parse_gate(t) for t in dict.fromkeys(recorded["gate"])
                      if "~ history" in " ".join(t.split())]  # fmt: skip
            known = sorted(set(store.figures(list(entries["entry_id"]))["figure"]))
            gates = _check_gates(gates, figure or [], within, known)
            if not gates:
                fail("nothing to check", f"{name}: no '~ history' gate; give --figure")
            found = trends(
                store, name, figures=[g.figure for g in gates], since=since, max_pvalue=None
            )
    if not found:
        fail("nothing to check", f"{name}: no run measured {', '.join(g.figure for g in gates)}")
    policy = GatingConfig()
    for series in dict.fromkeys(t.series for t in found):
        results: list[GateResult] = []
        for gate in gates:
            trend = next((t for t in found if t.series == series and t.figure == gate.figure), None)
            values = trend.values if trend else []
            figures = {gate.figure: values[-1] if values else None}
            results += evaluate_gates([gate], figures, past=_before_last(values), policy=policy)
        label = next(t for t in found if t.series == series)
        typer.echo(f"series {series}: {label.series_key['arm']}, {len(label.runs)} runs")
        code = int(any(not r.passed for r in results))
        print_gates(results, exit_code=code)
        suites.append(JunitSuite(f"zerowindow.history.{name}.{series}", "complete", None, 0.0,
                                 results, {"series": str(label.series_key)}))  # fmt: skip
    if junit is not None:
        with setup_errors("cannot write the JUnit file"):
            write_junit(junit, suites)
        typer.echo(f"junit: {junit}")
    raise typer.Exit(1 if any(not r.passed for s in suites for r in s.gates) else 0)
