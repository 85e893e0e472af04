"""The outputs written into a concluded folder, each a kind in the registry :data:`OUTPUTS`.

When a run, a configuration of a plan or a plan is concluded (``harness.lifecycle``), every
registered output writes its file into the folder from what the conclusion hands it
(:class:`Concluded`): ``junit`` writes ``junit.xml`` (one test suite per gated unit), ``html``
the self-contained ``report.html``. A plugin adds an output with one class and one
registration (``@OUTPUTS.register``, a ``kind`` and :meth:`FolderOutput.write`); a writer that
fails says why in a warning and never fails the run, whose results are written already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from harness.outputs._junit import JunitSuite, write_junit
from harness.outputs._report import report_or_warning
from harness.runfolder import JUNIT_XML
from zwcore import Registry


@dataclass(frozen=True)
class Concluded:
    """What a conclusion hands the outputs: the ``folder``, its gated ``units`` (one per run or
    configuration, :class:`~harness.outputs.JunitSuite`), and whether it gets a ``report``
    (a configuration's folder inside a plan does not: the plan's report shows it)."""

    folder: Path
    units: Sequence[JunitSuite] = field(default_factory=list)
    report: bool = True


class FolderOutput:
    """One output of a concluded folder. Subclasses set ``kind`` and :meth:`write`."""

    kind: ClassVar[str]

    def write(self, done: Concluded) -> str | None:
        """Write the output into ``done.folder``; ``None``, or a one-line warning when it could
        not be written."""
        raise NotImplementedError


OUTPUTS: Registry[FolderOutput] = Registry("output")
"""The outputs of a concluded folder, by ``kind``."""


@OUTPUTS.register
class JunitOutput(FolderOutput):
    """``junit.xml`` (``harness.outputs._junit``)."""

    kind: ClassVar[str] = "junit"

    def write(self, done: Concluded) -> str | None:
        if not done.units:  # nothing gated (a sweep's folder: each step has its own)
            return None
        try:
            write_junit(done.folder / JUNIT_XML, done.units)
        except OSError as exc:
            return f"warning: {JUNIT_XML} not written: {exc}"
        return None


@OUTPUTS.register
class HtmlReport(FolderOutput):
    """``report.html`` (``harness.outputs._report``)."""

    kind: ClassVar[str] = "html"

    def write(self, done: Concluded) -> str | None:
        return report_or_warning(done.folder) if done.report else None


def write_outputs(done: Concluded) -> list[str]:
    """Every registered output of ``done``, in kind order; the warnings of those that could not
    be written."""
    warnings = [OUTPUTS.get(kind)().write(done) for kind in OUTPUTS.kinds()]
    return [w for w in warnings if w]
