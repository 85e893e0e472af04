"""The ``zerowindow`` commands around a run: remote load workers, the tiny model, the servers
the toolkit ships, and network namespaces and shaped links (``netem``)."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from harness._cli_errors import setup_errors
from harness.lifecycle import DistributedError, run_worker

model_app = typer.Typer(help="Models for tests and demos.", no_args_is_help=True)
serve_app = typer.Typer(help="Servers the toolkit ships.", no_args_is_help=True)
engine_app = typer.Typer(help="Engines the toolkit builds from source.", no_args_is_help=True)
engine_build_app = typer.Typer(
    help="Build an engine from source into the cache (once).", no_args_is_help=True
)
engine_app.add_typer(engine_build_app, name="build")
netem_app = typer.Typer(
    help="Network namespaces and shaped links (needs CAP_NET_ADMIN).", no_args_is_help=True
)


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
    with setup_errors({DistributedError: "invalid argument", OSError: "cannot start the worker"}):
        code = run_worker(master, out_dir=out, name=name)
    raise typer.Exit(code)


class ModelFormat(StrEnum):
    """What `zerowindow model tiny` writes."""

    hf = "hf"
    gguf = "gguf"


@model_app.command("tiny")
def model_tiny(
    out_dir: Annotated[Path, typer.Argument(help="folder to write the model into")],
    seed: Annotated[int, typer.Option(help="seed of weights and tokenizer corpus")] = 0,
    format: Annotated[
        ModelFormat,
        typer.Option(
            "--format",
            help="hf: a Hugging Face folder (vLLM); gguf: also DIR/tiny.gguf from it (llama.cpp)",
        ),
    ] = ModelFormat.hf,
) -> None:
    """Write a random-weight Llama model and a locally trained tokenizer (no network); with
    --format gguf, also one GGUF file of it (made from the folder in DIR, written first if DIR
    has no config.json)."""
    from harness.servers import make_tiny_model

    with setup_errors(f"cannot write the tiny model to {out_dir}", also=(ValueError,)):
        if format is ModelFormat.hf or not (out_dir / "config.json").exists():
            path = make_tiny_model(out_dir, seed=seed)
            typer.echo(f"tiny model written to {path}")
        if format is ModelFormat.gguf:
            from harness.servers import GGUF_NAME, write_gguf

            typer.echo(str(write_gguf(out_dir, out_dir / GGUF_NAME)))


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

    raise typer.Exit(egress_main(ctx.args, prog="zerowindow serve egress"))


@engine_build_app.command("llama-server")
def engine_build_llama_server(
    jobs: Annotated[
        int | None, typer.Option(min=1, help="parallel compilers (default: the number of CPUs)")
    ] = None,
) -> None:
    """Build llama.cpp's llama-server into the cache, once.

    From the llama.cpp vendored in the llama-cpp-python sdist the Python engine uses (about 11
    minutes on 2 CPUs); a second call returns the cached binary at once. Prints the binary's
    path (the steps go to stderr). Run it with --no-ui: it has no web UI."""
    from harness.servers import build_llama_server

    with setup_errors("cannot build llama-server", also=(RuntimeError, ValueError)):
        path = build_llama_server(jobs=jobs, log=lambda line: typer.echo(line, err=True))
    typer.echo(str(path))


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
    unrecorded: Annotated[
        bool,
        typer.Option(
            help="also zw- resources no state file in --results accounts for (another job's?)"
        ),
    ] = False,
) -> None:
    """Remove what killed runs left: zw- namespaces, links, qdiscs, nftables tables, delay
    lines and processes (those their state files name, and those named after those runs);
    with --run-id, that run's; with --unrecorded, also zw- resources of no recorded run."""
    from netem import clean

    with setup_errors("cannot clean"):
        report = clean(results=results, run_id=run_id, force=force, unrecorded=unrecorded)
    for item in report.removed:
        typer.echo(f"removed {item}")
    for rid in report.skipped_live_runs:
        typer.echo(f"left alone: run {rid} is still running (--force to clean it)")
    for item in report.skipped_unrecorded:
        typer.echo(f"left alone: {item}: no run in {results} recorded it (--unrecorded)")
    if not report.removed:
        typer.echo("nothing to clean")


@netem_app.command("show")
def netem_show(
    netns: NetnsOption = None,
    ifname: Annotated[str | None, typer.Option(help="one interface")] = None,
) -> None:
    """The toolkit's namespaces and interfaces, the shaping on each, and running runs."""
    from netem import overview, show

    with setup_errors("cannot read the network state"):
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
    profile: Annotated[
        str,
        typer.Argument(
            help="a preset (lte, 3g, edge, ...), a TOML file with one profile table (down, "
            "up, preset), or SCENARIO.toml:NAME for one of its [netem.profiles]"
        ),
    ],
    ifname: Annotated[str, typer.Option(help="a zw- interface (the client-side end)")],
    netns: NetnsOption = None,
    backend: Annotated[str, typer.Option(help="auto, netem or fallback")] = "auto",
) -> None:
    """Shape IFNAME with PROFILE until Ctrl-C (up on its egress, down on its ingress)."""
    from netem import apply_and_hold, profile_argument

    with setup_errors(f"cannot shape {ifname}"):
        link = profile_argument(profile)
        errors = apply_and_hold(
            link,
            netns=netns,
            ifname=ifname,
            backend=backend,
            on_applied=lambda a: typer.echo(
                f"{link.name} on {ifname}: backend {a.backend} ({a.reason}); Ctrl-C to remove"
            ),
        )
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

    with setup_errors(f"cannot clear {ifname}"):
        removed = clear_shaping(netns=netns, ifname=ifname)
    for item in removed:
        typer.echo(f"removed {item}")
    if not removed:
        typer.echo("no shaping found")


def add_tool_commands(app: typer.Typer) -> None:
    """Add ``worker``, ``model``, ``serve``, ``engine`` and ``netem`` to the ``zerowindow`` app."""
    app.command()(worker)
    app.add_typer(model_app, name="model")
    app.add_typer(serve_app, name="serve")
    app.add_typer(engine_app, name="engine")
    app.add_typer(netem_app, name="netem")
