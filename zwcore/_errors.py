"""The toolkit's one exception tree.

Every error the toolkit raises on purpose derives from :class:`ZerowindowError`, so that the
command line maps errors to exit codes in one place (``harness.cli``): a
:class:`ScenarioError` or a set-up failure is exit code 2, a failure while the run measures is
exit code 1. Each package raises a subclass of the branch that names its concern.
"""

from __future__ import annotations


class ZerowindowError(Exception):
    """Root of every error the toolkit raises on purpose; ``str(error)`` says what went wrong
    and, where it can, where (file, line, field)."""


class ScenarioError(ZerowindowError):
    """A scenario (file, override or argument) that cannot be read or does not validate.
    ``str(error)`` names the file, the field and the line, one problem per line."""


class TargetError(ZerowindowError):
    """The server under test could not be started or reached, or died during the run."""


class ProxyError(TargetError):
    """A proxy in front of the target could not be started or died. A proxy is part of the
    serving stack under test, so it counts as a target failure where no finer answer is
    needed."""


class NetworkError(ZerowindowError):
    """Network namespaces, links, shaping or socket observation failed (``netem``)."""


class LoadError(ZerowindowError):
    """The load generator could not be set up or run (Locust processes, workers)."""


class RunFolderError(ZerowindowError):
    """A run folder (or a file in it, such as a baseline or ``run.json``) that is missing or
    cannot be read."""


class HistoryError(ZerowindowError):
    """A history store (``harness.history``) that cannot be opened, read or written: a file
    that is no DuckDB database, a database the toolkit did not create, one locked by another
    process. The file is left as it was."""
