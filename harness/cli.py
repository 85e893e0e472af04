"""The ``zerowindow`` command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from harness._cli_bench import bench_app
from harness._cli_errors import fail, setup_errors
from harness._cli_help import add_root_options, polish
from harness._cli_history import HistoryOption, NoHistoryOption, history_app
from harness._cli_plan import parse_rates, show_plan
from harness._cli_tools import add_tool_commands
from harness.analysis import parse_goodput
from harness.gates import BaselineError, load_baseline, save_baseline
from harness.lifecycle import plan_suite, reanalyze, run_plan, run_suite
from harness.outputs import SuiteResult, print_suite
from harness.runfolder import JUNIT_XML
from harness.scenario import (
    MASTER_BIND,
    RunOptions,
    Scenario,
    ScenarioError,
    SweepSettings,
    load_scenario,
    make_plan,
)
from zwcore import ZerowindowError

app = typer.Typer(
    help="Chaos and load testing for LLM streaming servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
add_tool_commands(app)
add_root_options(app)
baseline_app = typer.Typer(help="Baselines for relative gates.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")
suite_app = typer.Typer(help="The incident regression suite.", no_args_is_help=True)
app.add_typer(suite_app, name="suite")
app.add_typer(bench_app, name="bench")
app.add_typer(history_app, name="history")
# What stops `run` before it measures, by the error's class (harness._cli_errors).
_RUN_TITLES = {
    ScenarioError: "invalid argument",
    BaselineError: "cannot load the baseline",
    OSError: "cannot create the run folder",
    ZerowindowError: "cannot start the run",
}


def _options(scenario: Path, **fields: object) -> RunOptions:
    """The command's options; an invalid one, or a pair that excludes each other, is refused
    with exit 2 (pydantic's message, without its "Value error," prefix)."""
    try:
        return RunOptions.model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        message = str(err["msg"]).removeprefix("Value error, ")
        fail("invalid arguments", f"{where}: {message}" if where else message, scenario=scenario)


def _run_plan(
    scenario: Path, config: Scenario, options: RunOptions, out: Path, *, dry_run: bool
) -> None:
    """Make the plan (a pair of options that does not compose: exit 2), then print it
    (``dry_run``) or run it and show the result."""
    with setup_errors(_RUN_TITLES, scenario=scenario):
        plan = make_plan(config, options, scenario_path=scenario)
        if dry_run:
            typer.echo(json.dumps(plan.describe(), indent=2))
            raise typer.Exit(0)
        result = run_plan(plan, out_root=out)
    show_plan(result)
    raise typer.Exit(result.exit_code)


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario file (TOML)")],
    target_url: Annotated[
        str | None, typer.Option(help="attach to a running server instead of starting one")
    ] = None,
    out: Annotated[Path, typer.Option(help="folder that receives the run folders")] = Path(
        "results"
    ),
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="baseline file for gates that refer to 'baseline' "
            "(default: results/baselines/<scenario>.json)"
        ),
    ] = None,
    no_baseline: Annotated[
        bool,
        typer.Option(
            "--no-baseline",
            help="load no baseline: gates that refer to 'baseline' are reported as skipped "
            "(a scenario's first run, to save with `zerowindow baseline save`)",
        ),
    ] = False,
    progress: Annotated[
        bool, typer.Option(help="live progress (plain lines when stdout is not a terminal)")
    ] = True,
    workers: Annotated[
        int,
        typer.Option(
            min=0, help="run each user group as a Locust master with N worker processes here"
        ),
    ] = 0,
    remote_workers: Annotated[
        int,
        typer.Option(min=0, help="also wait for N workers joining with `zerowindow worker`"),
    ] = 0,
    master_bind: Annotated[
        str,
        typer.Option(
            help="HOST[:PORT] the masters listen on (group i on PORT+i; port 0: free ports)"
        ),
    ] = MASTER_BIND,
    repeats: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="run the workload N times against one target and gate on all of them, with "
            "intervals (default: the scenario's repeats); with proxies, N times each",
        ),
    ] = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="print the plan (what would run, with which options)"),
    ] = False,
    history: HistoryOption = None,
    no_history: NoHistoryOption = False,
) -> None:
    """Run SCENARIO and write results/<scenario>/<UTC timestamp>/: one run folder, or the
    plan's folder with one run folder per repeat (r1, r2 ..., control runs c1 ...) and per
    proxy configuration (`proxies = [...]`: none/, nginx/ ..., each with its repeats), their
    aggregate (figures with intervals, the comparison) and the gates over all of them.

    Exit code: 0 complete and every gate passed, 1 a gate failed or a run failed, 2 invalid
    scenario, a pair of options that does not compose, or a set-up error (missing baseline,
    target did not start), 130 interrupted. Writes junit.xml into the folder; appends a
    Markdown summary to $GITHUB_STEP_SUMMARY when it is set; adds the runs to the history
    (`zerowindow history`)."""
    options = _options(
        scenario, target_url=target_url, repeats=repeats, baseline=baseline,
        use_baseline=not no_baseline, workers=workers, remote_workers=remote_workers,
        master_bind=master_bind, progress=progress, history=history, use_history=not no_history,
    )  # fmt: skip
    with setup_errors("invalid scenario", scenario=scenario):
        config = load_scenario(scenario)
    _run_plan(scenario, config, options, out, dry_run=dry_run)


@app.command()
def analyze(
    run_dir: Annotated[
        Path, typer.Argument(help="a folder zerowindow wrote: a run, a plan's or a suite's")
    ],
    baseline: Annotated[
        Path | None,
        typer.Option(
            help="baseline file for gates that refer to 'baseline' "
            "(default: the baseline the run was gated against, kept in its folder)"
        ),
    ] = None,
    no_baseline: Annotated[
        bool,
        typer.Option("--no-baseline", help="report gates that refer to 'baseline' as skipped"),
    ] = False,
) -> None:
    """Analyse RUN_DIR again from what it recorded (a folder copied off another machine, or an
    analysis fix applied to old runs): a run's tables, summary.json, gates, junit.xml,
    run.json's end and report; a plan's runs and its aggregate (repeats.json, comparison,
    sweep table, gates, junit.xml, report); a suite's incidents and its junit.xml. Relative
    gates compare with the baseline the folder used, unless --baseline or --no-baseline says
    otherwise.

    Exit code as for `run`: 0 complete and every gate passed, 1 failed or a gate failed,
    2 not a folder zerowindow wrote, 130 the run was interrupted."""
    if baseline is not None and no_baseline:
        fail("invalid arguments", "--baseline and --no-baseline exclude each other")
    with setup_errors(f"cannot analyse {run_dir}"):
        base = (baseline, load_baseline(baseline)) if baseline is not None else None
        result = reanalyze(run_dir, baseline=base, use_baseline=not no_baseline)
    if isinstance(result, SuiteResult):
        print_suite(result)
    else:
        show_plan(result)
    raise typer.Exit(result.exit_code)


@baseline_app.command("save")
def baseline_save(
    run_dir: Annotated[Path, typer.Argument(help="run folder (results/<scenario>/<stamp>)")],
    to: Annotated[
        Path | None,
        typer.Option(help="file to write (default: results/baselines/<scenario>.json)"),
    ] = None,
    allow_incomplete: Annotated[
        bool,
        typer.Option("--allow-incomplete", help="save even if the run failed or was interrupted"),
    ] = False,
) -> None:
    """Save the figures of RUN_DIR as the baseline of its scenario."""
    with setup_errors("cannot save the baseline"):
        path = save_baseline(run_dir, to, allow_incomplete=allow_incomplete)
    typer.echo(f"baseline written to {path}")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder (results/<scenario>/<stamp>)")],
    out: Annotated[
        Path | None, typer.Option(help="where to write (default RUN_DIR/report.html)")
    ] = None,
) -> None:
    """Write RUN_DIR/report.html: one self-contained page with timelines, CDFs and verdicts."""
    from harness.outputs import write_report

    with setup_errors("cannot write the report"):
        path = write_report(run_dir, out)
    typer.echo(f"report written to {path}")


@app.command()
def compare(
    run_dirs: Annotated[list[Path], typer.Argument(help="two or more run folders")],
    fmt: Annotated[
        str, typer.Option("--format", help="table (terminal), markdown, csv or json")
    ] = "table",
    html: Annotated[
        Path | None, typer.Option(help="also write an HTML comparison with overlaid CDFs")
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option(help="figures matching this pattern, e.g. 'fast.ttft_*'")
    ] = None,
) -> None:
    """Print the runs' figures side by side, with ratios against the first run."""
    from rich.console import Console

    from harness.outputs import FORMATS, compare_runs, html_page, render, rich_table

    if len(run_dirs) < 2:
        fail("invalid arguments", f"compare needs two or more run folders, got {len(run_dirs)}")
    if fmt not in FORMATS:
        fail("invalid arguments", f"--format {fmt!r}: one of " + ", ".join(FORMATS))
    with setup_errors("cannot compare", also=(ValueError,)):
        comparison = compare_runs(run_dirs, only or ())
        if html is not None:
            html.write_text(html_page(comparison), encoding="utf-8")
    if fmt == "table":
        Console(width=None if sys.stdout.isatty() else 200).print(rich_table(comparison))
    else:
        typer.echo(render(comparison, fmt), nl=False)
    if html is not None:
        typer.echo(f"HTML comparison written to {html}", err=fmt != "table")


@app.command()
def schema(
    markdown: Annotated[
        bool, typer.Option("--markdown", help="the reference docs/scenarios.md instead")
    ] = False,
    plugins: Annotated[
        list[str] | None,
        typer.Option("--plugin", help="a scenario plugin whose kinds to include (repeatable)"),
    ] = None,
) -> None:
    """Print the JSON Schema of a scenario file (for editors: taplo, Even Better TOML), or with
    --markdown the reference of every table and field (docs/scenarios.md)."""
    import json

    from harness.scenario import scenario_json_schema, scenario_reference
    from zwcore import load_plugins

    specs = [str(Path(p).resolve()) if p.endswith(".py") else p for p in plugins or []]
    with setup_errors("cannot load the plugins"):
        load_plugins(specs)
    if markdown:
        typer.echo(scenario_reference(), nl=False)
    else:
        typer.echo(json.dumps(scenario_json_schema(), indent=2))


@app.command()
def sweep(
    scenario: Annotated[Path, typer.Argument(help="scenario file (TOML) with an open-loop group")],
    steps: Annotated[
        int, typer.Option(min=0, help="rates between the serial and throughput runs")
    ] = 4,
    rates: Annotated[
        str | None,
        typer.Option(help="comma-separated total rates (requests/s) instead of --steps"),
    ] = None,
    sla: Annotated[
        bool,
        typer.Option(help="then bisect to the highest rate whose run passes the gates"),
    ] = False,
    sla_on: Annotated[
        str,
        typer.Option(help="what --sla bisects: rate, or concurrency (all at once, capped)"),
    ] = "rate",
    sla_steps: Annotated[int, typer.Option(min=1, help="bisection steps of --sla")] = 5,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            help="a service-level objective KEY:MS for goodput (ttft, tpot, e2el), "
            "repeatable, as vllm bench serve --goodput"
        ),
    ] = None,
    serial_requests: Annotated[
        int, typer.Option(min=1, help="requests per group in the serial run, at most")
    ] = 32,
    out: Annotated[Path, typer.Option(help="results root")] = Path("results"),
    target_url: Annotated[
        str | None, typer.Option(help="attach to a running server instead of starting one")
    ] = None,
    workers: Annotated[
        int, typer.Option(min=0, help="run each group as a Locust master with N workers here")
    ] = 0,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="print the plan (what would run, with which options)"),
    ] = False,
    history: HistoryOption = None,
    no_history: NoHistoryOption = False,
) -> None:
    """Run SCENARIO's open-loop groups at rising rates against one target: one request at a
    time, all at once, then rates between (or --rates), with --sla a bisection to the highest
    rate whose run passes the gates. Writes results/<scenario>/<stamp>/ with a run folder per
    rate and sweep.json, sweep.md and sweep.html (figures against the rate).

    Exit code: 0 every run completed (gates may fail at high rates), 1 a run failed, 2 invalid
    scenario, a pair of options that does not compose, or a set-up error, 130 interrupted."""
    with setup_errors("invalid scenario", scenario=scenario):
        config = load_scenario(scenario)
    with setup_errors("invalid argument", scenario=scenario, also=(ValueError,)):
        settings = SweepSettings(
            steps=steps, rates_rps=parse_rates(rates), sla=sla,
            sla_on="rate" if sla_on == "rate" else "concurrency", sla_steps=sla_steps,
            serial_requests=serial_requests, goodput_slo_ms=parse_goodput(goodput or []),
        )  # fmt: skip
        if sla_on not in ("rate", "concurrency"):
            raise ValueError(f"--sla-on {sla_on!r}: expected rate or concurrency")
    options = _options(
        scenario, target_url=target_url, workers=workers, sweep=settings, history=history,
        use_history=not no_history,
    )  # fmt: skip
    _run_plan(scenario, config, options, out, dry_run=dry_run)


def main() -> None:
    app()


if __name__ == "__main__":
    main()


@suite_app.command("run")
def suite_run(
    directory: Annotated[Path, typer.Argument(help="folder of incident scenarios (TOML)")],
    target: Annotated[
        str,
        typer.Option(
            help="scenario (each incident's own target table), or a target kind that can stand "
            "in for it: sim (the emulator), vllm (a real vLLM serving --model, started for each "
            "incident)"
        ),
    ] = "scenario",
    model: Annotated[
        str | None,
        typer.Option(help="with --target KIND that loads one (vllm): the model [models/tiny]"),
    ] = None,
    target_url: Annotated[
        str | None, typer.Option(help="run every incident against this running server")
    ] = None,
    engine_dir: Annotated[
        Path | None,
        typer.Option(help="with --target-url: where that server's engine probe writes"),
    ] = None,
    served_model_name: Annotated[
        str | None,
        typer.Option(help="with --target-url: the model to ask for (default: its first)"),
    ] = None,
    only: Annotated[str | None, typer.Option(help="comma-separated incident names to run")] = None,
    out: Annotated[Path, typer.Option(help="results root")] = Path("results"),
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="print each incident's plan; run nothing")
    ] = False,
    history: HistoryOption = None,
    no_history: NoHistoryOption = False,
) -> None:
    """Run the incidents in DIRECTORY one after another: one JUnit test case per incident and
    per disconnect-matrix cell in results/suite/<stamp>/junit.xml, a summary table.

    Exit code: 0 every case passed (findings never fail a case), 1 a case failed, 2 invalid
    incident or argument, 130 interrupted."""
    titles = {ValueError: "invalid argument", ZerowindowError: "invalid incident or argument"}
    with setup_errors(titles, also=(ValueError,)):
        if target_url is not None and target != "scenario":
            raise ValueError(f"give --target {target} or --target-url, not both")
        if engine_dir is not None and target_url is None:
            raise ValueError("--engine-dir is for --target-url (a server this run does not start)")
        if served_model_name is not None and target_url is None:
            raise ValueError("--served-model-name is for --target-url (the model it serves)")
        if model is not None and (target_url is not None or target == "scenario"):
            raise ValueError(
                "--model is for --target KIND (a server the suite starts for each incident), "
                + ("not with --target-url" if target_url else "not the incidents' own targets")
            )
        names = [n.strip() for n in only.split(",") if n.strip()] if only is not None else None
        if names is not None and not names:
            raise ValueError("--only: give incident names, comma-separated")
        planning = {
            "target_url": target_url, "engine_dir": engine_dir, "only": names, "model": model,
            "served_model_name": served_model_name,
            "options": RunOptions(history=history, use_history=not no_history),
        }  # fmt: skip
        if dry_run:
            plans = plan_suite(directory, target=target, **planning)  # type: ignore[arg-type]
            typer.echo(json.dumps([p.describe() for _, p in plans], indent=2))
            raise typer.Exit(0)
        result = run_suite(directory, target=target, out_root=out, **planning)
    print_suite(result)
    typer.echo(f"junit: {result.run_dir / JUNIT_XML}")
    raise typer.Exit(result.exit_code)


polish(app)  # every command registered above: reflowed help and its example
