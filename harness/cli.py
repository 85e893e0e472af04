"""The ``zerowindow`` command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from harness.gates._baseline import BaselineError, save_baseline
from harness.outputs._console import print_gates, print_summary
from harness.lifecycle._distributed import DistributedError, Distribution, parse_address, run_worker
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._run import EXIT_SETUP, run_scenario
from harness.scenario import Scenario
from harness.scenario import ScenarioError, load_scenario
from harness.outputs._step_summary import ENV as STEP_SUMMARY_ENV
from harness.outputs._step_summary import append_setup_error, append_step_summary

app = typer.Typer(
    help="Chaos and load testing for LLM streaming servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Models for tests and demos.", no_args_is_help=True)
app.add_typer(model_app, name="model")
serve_app = typer.Typer(help="Servers the toolkit ships.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")
netem_app = typer.Typer(
    help="Network namespaces and shaped links (needs CAP_NET_ADMIN).", no_args_is_help=True
)
app.add_typer(netem_app, name="netem")
baseline_app = typer.Typer(help="Baselines for relative gates.", no_args_is_help=True)
app.add_typer(baseline_app, name="baseline")


def _setup_error(scenario: Path, title: str, detail: str) -> NoReturn:
    """Report an error that stops `run` before it starts (stderr and, under GitHub Actions,
    the job summary) and exit 2."""
    typer.echo(f"{title}\n{detail}", err=True)
    try:
        append_setup_error(scenario, title, detail)
    except OSError as exc:
        typer.echo(f"cannot append to ${STEP_SUMMARY_ENV}: {exc}", err=True)
    raise typer.Exit(EXIT_SETUP)


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
    ] = "127.0.0.1:0",
) -> None:
    """Run SCENARIO and write results/<scenario>/<UTC timestamp>/ (with `proxies = [...]`: one
    run folder per proxy configuration in it, and the comparison).

    Exit code: 0 complete and every gate passed, 1 a gate failed or the run failed, 2 invalid
    scenario or set-up error (missing baseline, target did not start), 130 interrupted.
    Writes junit.xml into the run folder; appends a Markdown summary to $GITHUB_STEP_SUMMARY
    when it is set."""
    if baseline is not None and no_baseline:
        _setup_error(
            scenario, "invalid arguments", "--baseline and --no-baseline exclude each other"
        )
    try:
        config = load_scenario(scenario)
    except ScenarioError as exc:
        _setup_error(scenario, "invalid scenario", str(exc))
    distribution = None
    if workers or remote_workers:
        try:
            host, port = parse_address(master_bind, default_port=0)
            distribution = Distribution(workers, remote_workers, host, port)
        except DistributedError as exc:
            _setup_error(scenario, "invalid argument", str(exc))
    if config.proxies:
        if distribution is not None:
            _setup_error(
                scenario,
                "invalid argument",
                "--workers/--remote-workers do not apply to a scenario with proxies = [...] yet",
            )
        _run_comparison(config, scenario, out, target_url)
    try:
        result = run_scenario(
            config,
            scenario_path=scenario,
            out_root=out,
            target_url=target_url,
            baseline=baseline,
            use_baseline=not no_baseline,
            progress=RunProgress() if progress else None,
            distribution=distribution,
        )
    except ScenarioError as exc:
        _setup_error(scenario, "invalid argument", str(exc))
    except BaselineError as exc:
        _setup_error(scenario, "cannot load the baseline", str(exc))
    except OSError as exc:
        _setup_error(scenario, "cannot create the run folder", f"under {out}: {exc.strerror}")
    print_summary(result.summary, run_dir=str(result.run_dir))
    print_gates(result.gates, exit_code=result.exit_code)
    try:
        append_step_summary(
            result.summary, result.gates, run_dir=result.run_dir, exit_code=result.exit_code
        )
    except OSError as exc:
        typer.echo(f"cannot append to ${STEP_SUMMARY_ENV}: {exc}", err=True)
    if (report_path := result.run_dir / "report.html").exists():
        typer.echo(f"report: {report_path}")
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
    try:
        path = save_baseline(run_dir, to, allow_incomplete=allow_incomplete)
    except BaselineError as exc:
        typer.echo(f"cannot save the baseline\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    typer.echo(f"baseline written to {path}")


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder (results/<scenario>/<stamp>)")],
    out: Annotated[
        Path | None, typer.Option(help="where to write (default RUN_DIR/report.html)")
    ] = None,
) -> None:
    """Write RUN_DIR/report.html: one self-contained page with timelines, CDFs and verdicts."""
    from harness.outputs._report import ReportError, write_report

    try:
        path = write_report(run_dir, out)
    except ReportError as exc:
        typer.echo(f"cannot write the report\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    except OSError as exc:
        typer.echo(f"cannot write the report to {exc.filename}: {exc.strerror}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
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

    from harness.outputs._compare import FORMATS, compare_runs, html_page, render, rich_table
    from harness.outputs._report import ReportError

    if len(run_dirs) < 2 or fmt not in FORMATS:
        typer.echo(
            "compare needs two or more run folders and --format " + "|".join(FORMATS), err=True
        )
        raise typer.Exit(EXIT_SETUP)
    try:
        comparison = compare_runs(run_dirs, only or ())
        if html is not None:
            html.write_text(html_page(comparison), encoding="utf-8")
    except (ReportError, ValueError) as exc:
        typer.echo(f"cannot compare\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    except OSError as exc:
        typer.echo(f"cannot write {exc.filename}: {exc.strerror}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    if fmt == "table":
        Console(width=None if sys.stdout.isatty() else 200).print(rich_table(comparison))
    else:
        typer.echo(render(comparison, fmt), nl=False)
    if html is not None:
        typer.echo(f"HTML comparison written to {html}", err=fmt != "table")


def _run_comparison(config: Scenario, path: Path, out: Path, target_url: str | None) -> None:
    from harness.analysis._comparison import print_comparison
    from harness.lifecycle._comparison_run import run_comparison

    try:
        result = run_comparison(config, scenario_path=path, out_root=out, target_url=target_url)
    except ScenarioError as exc:
        _setup_error(path, "invalid argument", str(exc))
    except OSError as exc:
        _setup_error(path, "cannot create the run folder", f"under {out}: {exc.strerror}")
    if result.comparison is not None:
        print_comparison(result.comparison, title=config.name)
    for name, run in result.runs.items():
        if run.gates:
            typer.echo(f"gates of {name}:")
            print_gates(run.gates, exit_code=run.exit_code)
    if result.failure:
        typer.secho(f"comparison incomplete: {result.failure}", fg="red", err=True)
    typer.echo(f"results: {result.run_dir}")
    raise typer.Exit(result.exit_code)


@app.command()
def worker(
    master: Annotated[str, typer.Option(help="HOST:PORT of a group's Locust master")],
    out: Annotated[
        Path, typer.Option(help="folder for this worker's own copy of its files")
    ] = Path("results/worker"),
    name: Annotated[
        str | None, typer.Option(help="worker name in file names (default HOSTNAME-PID)")
    ] = None,
) -> None:
    """Join a master of `zerowindow run --remote-workers N` as one Locust worker; its records
    reach the run folder through the master."""
    try:
        code = run_worker(master, out_dir=out, name=name)
    except DistributedError as exc:
        typer.echo(f"invalid argument\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    except OSError as exc:
        typer.echo(f"cannot start the Locust worker: {exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    raise typer.Exit(code)


@model_app.command("tiny")
def model_tiny(
    out_dir: Annotated[Path, typer.Argument(help="folder to write the model into")],
    seed: Annotated[int, typer.Option(help="seed of weights and tokenizer corpus")] = 0,
) -> None:
    """Write a random-weight Llama model and a locally trained tokenizer (no network)."""
    from harness.servers._tiny_model import make_tiny_model

    try:
        path = make_tiny_model(out_dir, seed=seed)
    except (OSError, ValueError) as exc:
        typer.echo(f"cannot write the tiny model to {out_dir}: {exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    typer.echo(f"tiny model written to {path}")


@serve_app.command(
    "sim",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve_sim(ctx: typer.Context) -> None:
    """Run the engine emulator in the foreground (options: --help; every SimConfig field, e.g.
    --port 8000 --kv-release on_delivery --num-blocks 64)."""
    from harness._sim.__main__ import main as sim_main

    raise typer.Exit(sim_main(ctx.args))


@serve_app.command(
    "egress",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def serve_egress(ctx: typer.Context) -> None:
    """Run the decoupled egress buffer in the foreground (options: --help; e.g.
    --upstream http://127.0.0.1:8000 --listen 127.0.0.1:8080 --stall-timeout-s 2.5)."""
    from harness._egress import main as egress_main

    raise typer.Exit(egress_main(ctx.args))


NetnsOption = Annotated[
    str | None, typer.Option("--netns", help="network namespace (default: the host's)")
]


@netem_app.command("clean")
def netem_clean(
    results: Annotated[Path, typer.Option(help="folder whose run state files to use")] = Path(
        "results"
    ),
    run_id: Annotated[str | None, typer.Option(help="only this run's resources")] = None,
    force: Annotated[bool, typer.Option(help="also runs whose process still runs")] = False,
) -> None:
    """Remove what killed runs left: zw- namespaces, links, qdiscs, nftables tables, delay
    lines and processes (from the runs' state files and by the zw- prefix)."""
    from netem import clean
    from netem import NetemError

    try:
        report = clean(results=results, run_id=run_id, force=force)
    except NetemError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_SETUP) from None
    for item in report.removed:
        typer.echo(f"removed {item}")
    for rid in report.skipped_live_runs:
        typer.echo(f"left alone: run {rid} is still running (--force to clean it)")
    if not report.removed:
        typer.echo("nothing to clean")


@netem_app.command("show")
def netem_show(
    netns: NetnsOption = None,
    ifname: Annotated[str | None, typer.Option(help="one interface")] = None,
) -> None:
    """The toolkit's namespaces and interfaces, the shaping on each, and running runs."""
    from netem import overview
    from netem import show

    if ifname is not None:
        typer.echo(repr(show(netns, ifname)))
        return
    view = overview()
    for run in view["runs"]:
        state = "running" if run["alive"] else "dead (zerowindow netem clean)"
        typer.echo(f"run {run['run_id']}: {state}, {run['resources']} resources, {run['run_dir']}")
    for ns, links in view["namespaces"].items():
        typer.echo(f"{ns or '(host)'}")
        for name, st in links.items():
            qd = ", ".join(f"{q.kind} {q.parent}" for q in st.qdiscs) or "no qdisc"
            lines = f"; delay lines {[p for p, _ in st.delay_lines]}" if st.delay_lines else ""
            typer.echo(f"  {name}: {'shaped' if st.shaped else 'not shaped'} ({qd}){lines}")


@netem_app.command("apply")
def netem_apply(
    profile: Annotated[str, typer.Argument(help="preset name (lte, 3g, edge, ...)")],
    ifname: Annotated[str, typer.Option(help="a zw- interface (the client-side end)")],
    netns: NetnsOption = None,
    backend: Annotated[str, typer.Option(help="auto, netem or fallback")] = "auto",
) -> None:
    """Shape IFNAME with PROFILE until Ctrl-C (up on its egress, down on its ingress)."""
    from netem import apply_and_hold
    from netem import NetemError
    from netem import UnknownPreset, preset

    try:
        link = preset(profile)
        errors = apply_and_hold(
            link,
            netns=netns,
            ifname=ifname,
            backend=backend,
            on_applied=lambda a: typer.echo(
                f"{link.name} on {ifname}: backend {a.backend} ({a.reason}); Ctrl-C to remove"
            ),
        )
    except (NetemError, UnknownPreset) as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_SETUP) from None
    for err in errors:
        typer.echo(f"release: {err}", err=True)
    typer.echo("shaping removed")


@netem_app.command("clear")
def netem_clear(
    ifname: Annotated[str, typer.Option(help="a zw- interface")],
    netns: NetnsOption = None,
) -> None:
    """Remove the toolkit's shaping from IFNAME (e.g. after a killed `netem apply`)."""
    from netem import clear_shaping
    from netem import NetemError

    try:
        removed = clear_shaping(netns=netns, ifname=ifname)
    except NetemError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(EXIT_SETUP) from None
    for item in removed:
        typer.echo(f"removed {item}")
    if not removed:
        typer.echo("no shaping found")


def main() -> None:
    app()
