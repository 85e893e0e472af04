"""The command line's help as a reader meets it: each command's docstring reflowed into
paragraphs (typer keeps a docstring's single line breaks after its first paragraph, so wrapped
source lines came out as ragged lines), and one example per command, under it.

:data:`EXAMPLES` is checked by the tests: every command has one, and each parses with the
command's own options (a renamed option fails them).
"""

from __future__ import annotations

import inspect
from typing import Annotated

import typer

from harness.servers import package_version

# Command path (as typed after `zerowindow`) -> an example invocation's arguments.
EXAMPLES = {
    "run": "scenarios/sim-gates.toml --repeats 3",
    "analyze": "results/sim-gates/20261206T120000Z",
    "report": "results/sim-gates/20261206T120000Z",
    "compare": "results/sim-gates/20261206T120000Z results/sim-gates/20261206T130000Z "
    "--only 'fast.ttft_*'",
    "schema": "--markdown",
    "sweep": "scenarios/sim-open-loop.toml --steps 4 --sla",
    "worker": "--master 127.0.0.1:5557",
    "baseline save": "results/sim-gates/20261206T120000Z",
    "suite run": "scenarios/incidents --target sim --only whole-answer-disconnect",
    "history add": "results/",
    "history show": "sim-gates --figure 'fast.*_p99_ms' --out trends/",
    "history check": "scenarios/sim-gates.toml --junit history.xml",
    "bench client": "--streams 100 --events 2000",
    "bench proxy": "--proxies none,egress,nginx --duration-s 5",
    "bench gates": "scenarios/sim-gates.toml scenarios/sim-coupled.toml --trials 5",
    "model tiny": "models/tiny --format gguf",
    "serve sim": "--port 8000 --kv-release on_delivery",
    "serve egress": "--upstream http://127.0.0.1:8000 --listen 127.0.0.1:8080",
    "engine build llama-server": "--jobs 2",
    "netem clean": "--unrecorded",
    "netem show": "",
    "netem apply": "3g --ifname zw-c0 --netns zw-client",
    "netem clear": "--ifname zw-c0 --netns zw-client",
}


def reflow(doc: str) -> str:
    """``doc`` with each paragraph on one line (paragraphs stay apart; a paragraph of list
    items, lines starting ``- ``, keeps one item a line)."""
    out = []
    for paragraph in inspect.cleandoc(doc).split("\n\n"):
        items: list[str] = []
        for line in paragraph.splitlines():
            text = line.strip()
            if items and not text.startswith("- "):
                items[-1] += f" {text}"
            else:
                items.append(text)
        out.append("\n".join(items) if items[0].startswith("- ") else " ".join(items))
    return "\n\n".join(out)


def polish(app: typer.Typer, path: str = "") -> None:
    """Reflow the help of every command of ``app`` and its sub-apps, add its example
    (:data:`EXAMPLES`) as the epilog, and read help as plain text (rich markup would take
    ``[history]`` or ``[models/tiny]`` for a style and drop it)."""
    app.rich_markup_mode = None
    for info in app.registered_commands:
        assert info.callback is not None
        name = f"{path} {info.name or info.callback.__name__.replace('_', '-')}".strip()
        info.help = reflow(info.help or inspect.getdoc(info.callback) or "")
        if name in EXAMPLES:
            info.epilog = f"Example: zerowindow {name} {EXAMPLES[name]}".rstrip()
    for group in app.registered_groups:
        assert group.typer_instance is not None
        polish(group.typer_instance, f"{path} {group.name}".strip())


def _version(value: bool) -> None:
    if value:
        typer.echo(f"zerowindow {package_version('zerowindow')}")
        raise typer.Exit(0)


def add_root_options(app: typer.Typer) -> None:
    """The options of ``zerowindow`` itself: ``--version``."""

    @app.callback()
    def _root(
        version: Annotated[
            bool,
            typer.Option("--version", is_eager=True, callback=_version, help="print the version"),
        ] = False,
    ) -> None:
        """Chaos and load testing for LLM streaming servers."""
