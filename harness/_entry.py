"""The ``zerowindow`` command's entry point (``[project.scripts]``, ``python -m harness``).

Importing the CLI takes the first second or so (typer, pydantic, pandas...). The import runs
inside a guard, so that Ctrl-C in that time ends with one line and exit code 130, as Ctrl-C
during a run does, instead of a ``KeyboardInterrupt`` traceback: nothing has been created yet.
"""

from __future__ import annotations

import os
import signal
import sys

EXIT_INTERRUPTED = 128 + 2  # SIGINT, as harness.lifecycle.EXIT_INTERRUPTED (not imported yet)


def main() -> None:
    """Import and run the CLI (``harness.cli.main``)."""
    try:
        from harness.cli import main as cli_main
    except KeyboardInterrupt:
        # Nothing was created: leave at once, past the interpreter's finalization, where a
        # half-imported module's clean-up or a second Ctrl-C once ended the process by SIGINT
        # itself (exit -2 instead of 130, after this line was printed).
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("zerowindow: interrupted while starting; nothing was run", file=sys.stderr)
        sys.stderr.flush()
        os._exit(EXIT_INTERRUPTED)
    cli_main()
