"""The ``zerowindow`` command line: a thin layer that parses arguments and calls the library."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from harness._console import print_summary
from harness._distributed import DistributedError, Distribution, parse_address, run_worker
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
    """Run SCENARIO and write results/<scenario>/<UTC timestamp>/."""
    try:
        config = load_scenario(scenario)
    except ScenarioError as exc:
        typer.echo(f"invalid scenario\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    distribution = None
    if workers or remote_workers:
        try:
            host, port = parse_address(master_bind, default_port=0)
            distribution = Distribution(workers, remote_workers, host, port)
        except DistributedError as exc:
            typer.echo(f"invalid argument\n{exc}", err=True)
            raise typer.Exit(EXIT_SETUP) from None
    try:
        result = run_scenario(
            config,
            scenario_path=scenario,
            out_root=out,
            target_url=target_url,
            distribution=distribution,
        )
    except ScenarioError as exc:
        typer.echo(f"invalid argument\n{exc}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    except OSError as exc:
        typer.echo(f"cannot create the run folder under {out}: {exc.strerror}", err=True)
        raise typer.Exit(EXIT_SETUP) from None
    print_summary(result.summary, run_dir=str(result.run_dir))
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
