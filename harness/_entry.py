"""The ``zerowindow`` command's entry point (``[project.scripts]``, ``python -m harness``).

Importing the CLI takes the first second or so (typer, pydantic, pandas...). The import runs
inside a guard, so that Ctrl-C in that time ends with one line and exit code 130, as Ctrl-C
during a run does, instead of a ``KeyboardInterrupt`` traceback: nothing has been created yet.
"""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 128 + 2  # SIGINT, as harness.lifecycle.EXIT_INTERRUPTED (not imported yet)


def main() -> None:
    """Import and run the CLI (``harness.cli.main``)."""
    try:
        from harness.cli import main as cli_main
    except KeyboardInterrupt:
        print("zerowindow: interrupted while starting; nothing was run", file=sys.stderr)
        raise SystemExit(EXIT_INTERRUPTED) from None
    cli_main()
