"""The command line's help: paragraphs that wrap to the terminal, one example per command, and
each example parses with the command's own options (a renamed option fails here)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest
import typer.main

from harness._cli_help import EXAMPLES, reflow
from harness.cli import app
from tests.conftest import run_cli


def _leaves() -> dict[str, Any]:
    """Every command (not group) of the CLI by its path, as typer builds them (its own click)."""
    root = typer.main.get_command(app)
    out: dict[str, Any] = {}

    def walk(command: Any, path: list[str]) -> None:
        if hasattr(command, "list_commands"):
            ctx = command.make_context(command.name, ["--help"], resilient_parsing=True)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                walk(sub, [*path, name])
        else:
            out[" ".join(path)] = command

    walk(root, [])
    return out


def test_every_command_has_an_example_and_it_parses():
    leaves = _leaves()
    assert set(leaves) == set(EXAMPLES)
    for name, command in leaves.items():
        args = shlex.split(EXAMPLES[name])
        with command.make_context(name, args, resilient_parsing=False) as ctx:
            assert ctx.params is not None, name
        assert command.epilog == f"Example: zerowindow {name} {EXAMPLES[name]}".rstrip()


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_help_paragraphs_have_no_hard_line_breaks(name):
    help_text = _leaves()[name].help or ""
    assert help_text, name
    for paragraph in help_text.split("\n\n"):
        lines = paragraph.splitlines()
        assert len(lines) == 1 or all(line.startswith("- ") for line in lines), (name, paragraph)


def test_reflow_keeps_paragraphs_and_list_items():
    doc = """First line
    goes on.

    - one item
      continued
    - two

    Last."""
    assert reflow(doc) == "First line goes on.\n\n- one item continued\n- two\n\nLast."


def test_help_on_a_terminal_wraps_and_ends_with_the_example():
    proc = run_cli("history", "show", "--help")
    assert proc.returncode == 0
    assert "Example: zerowindow history show sim-gates" in proc.stdout


def test_version():
    proc = run_cli("--version")
    assert proc.returncode == 0 and proc.stdout.startswith("zerowindow ")
