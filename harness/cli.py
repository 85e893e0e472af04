"""The ``zerowindow`` command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from harness._console import print_summary
from harness._run import EXIT_SETUP, run_scenario
from harness._scenario import ScenarioError, load_scenario

app = typer.Typer(
    help="Chaos and load testing for LLM streaming servers.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Models for tests and demos.", no_args_is_help=True)
app.add_typer(model_app, name="model")
serve_app = typer.Typer(help="Servers the toolkit ships.", no_args_is_help=True)
app.add_typer(serve_app, name="serve")


@app.command()
def run(
    scenario: Annotated[Path, typer.Argument(help="scenario file (TOML)")],
    target_url: Annotated[
        str | None, typer.Option(help="attach to a running server instead of starting one")
    ] = None,
    out: Annotated[Path, typer.Option(help="folder that receives the run folders")] = Path(
        "results"
    ),
) -> None:
    """Run SCENARIO and write results/<scenario>/<UTC timestamp>/."""
    try:
        config = load_scenario(scenario)
    except ScenarioError as exc:
        typer.echo(f"invalid scenario\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    try:
        result = run_scenario(config, scenario_path=scenario, out_root=out, target_url=target_url)
    except ScenarioError as exc:
        typer.echo(f"invalid argument\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    except OSError as exc:
        typer.echo(f"cannot create the run folder under {out}: {exc.strerror}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    print_summary(result.summary, run_dir=str(result.run_dir))
    if (report_path := result.run_dir / "report.html").exists():
        typer.echo(f"report: {report_path}")
    raise typer.Exit(result.exit_code)


@app.command()
def report(
    run_dir: Annotated[Path, typer.Argument(help="run folder (results/<scenario>/<stamp>)")],
    out: Annotated[
        Path | None, typer.Option(help="where to write (default RUN_DIR/report.html)")
    ] = None,
) -> None:
    """Write RUN_DIR/report.html: one self-contained page with timelines, CDFs and verdicts."""
    from harness._report import ReportError, write_report

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

    from harness._compare import FORMATS, compare_runs, html_page, render, rich_table
    from harness._report import ReportError

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


@model_app.command("tiny")
def model_tiny(
    out_dir: Annotated[Path, typer.Argument(help="folder to write the model into")],
    seed: Annotated[int, typer.Option(help="seed of weights and tokenizer corpus")] = 0,
) -> None:
    """Write a random-weight Llama model and a locally trained tokenizer (no network)."""
    from harness._tiny_model import make_tiny_model

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


def main() -> None:
    app()
