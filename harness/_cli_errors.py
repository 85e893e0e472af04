"""The one place where the command line turns an error into an exit code.

A command wraps the library calls that may fail before anything is measured in
:func:`setup_errors`; what they raise on purpose (:class:`zwcore.ZerowindowError`, or an
``OSError`` from the file system) is printed as a title and a detail on stderr and ends the
command with exit code 2 (``EXIT_SETUP``), never with a traceback. Errors during a run are not
raised: the run writes what it measured and its result carries the exit code
(``harness.lifecycle.exit_code``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import typer

from harness.lifecycle import EXIT_SETUP
from harness.outputs import STEP_SUMMARY_ENV, append_setup_error
from zwcore import ZerowindowError

Titles = Mapping[type[Exception], str]


def fail(title: str, detail: str, *, scenario: Path | None = None) -> NoReturn:
    """Print ``title`` and ``detail`` on stderr and exit 2. With ``scenario`` (a `run` that
    stopped before it started), also append them to ``$GITHUB_STEP_SUMMARY`` when it is set."""
    typer.echo(f"{title}\n{detail}", err=True)
    if scenario is not None:
        try:
            append_setup_error(scenario, title, detail)
        except OSError as exc:
            typer.echo(f"cannot append to ${STEP_SUMMARY_ENV}: {exc}", err=True)
    raise typer.Exit(EXIT_SETUP)


def describe(exc: BaseException) -> str:
    """The text of an error for a person: an ``OSError`` as ``file: reason``, any other as
    ``str(exc)``."""
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc)


@contextmanager
def setup_errors(
    titles: str | Titles, *, scenario: Path | None = None, also: tuple[type[Exception], ...] = ()
) -> Iterator[None]:
    """Exit 2 with a clear message on a :class:`ZerowindowError`, an ``OSError`` or one of
    ``also`` raised in the block. ``titles`` is the title printed above the error's text, or a
    mapping from exception classes to titles (the first class the error is an instance of
    wins; an error matching none gets the first title)."""
    caught: tuple[type[Exception], ...] = (ZerowindowError, OSError, *also)
    try:
        yield
    except caught as exc:
        table = {Exception: titles} if isinstance(titles, str) else titles
        title = next((t for cls, t in table.items() if isinstance(exc, cls)), None)
        fail(title or next(iter(table.values())), describe(exc), scenario=scenario)
