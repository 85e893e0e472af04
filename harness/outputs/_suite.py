"""The incident suite's outputs: ``junit.xml`` (one test case per incident and per matrix
cell) and the console table. Written with ``junitparser`` like a run's own ``junit.xml``."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.gates import GateResult

SUITE_JUNIT = "junit.xml"


@dataclass
class CaseOutcome:
    """One test case of the suite: an incident or one cell of a matrix. ``failures``: why
    the stack failed it (empty: passed); ``findings``: the findings' results (never failures);
    ``details``: lines a person reads (figures, run folders). A finding is ``(label,
    result)``: the configuration it was measured in (``""`` for a scenario without
    ``proxies``)."""

    name: str
    incident: str
    failures: list[str] = field(default_factory=list)
    findings: list[tuple[str, GateResult]] = field(default_factory=list)
    details: list[str] = field(default_factory=list)
    error: str | None = None  # the run did not complete (an error, not a failure)
    skipped: str | None = None  # why it did not run
    duration_s: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.failures and self.error is None and self.skipped is None


@dataclass
class SuiteResult:
    """The suite's run folder, its cases in run order and its exit code (0 every case passed,
    1 one failed, 130 interrupted)."""

    run_dir: Path
    cases: list[CaseOutcome] = field(default_factory=list)
    exit_code: int = 0


def finding_line(finding: tuple[str, GateResult]) -> str:
    """``[<label>: ]<gate>: holds|does not hold (<reason>)``."""
    label, g = finding
    where = f"{label}: " if label else ""
    return f"{where}{g.gate}: {'holds' if g.passed else 'does not hold'} ({g.reason})"


def case_record(c: CaseOutcome) -> dict[str, Any]:
    """A case as ``suite.json`` keeps it (and the suite's report shows it)."""
    return {
        "name": c.name, "incident": c.incident, "passed": c.passed, "failures": c.failures,
        "error": c.error, "skipped": c.skipped, "findings": [finding_line(f) for f in c.findings],
        "details": c.details, "duration_s": c.duration_s,
    }  # fmt: skip


def _case(c: CaseOutcome) -> TestCase:
    case = TestCase(c.name, classname=f"zerowindow.suite.{c.incident}", time=c.duration_s)
    if c.skipped is not None:
        case.result = [Skipped(c.skipped)]
    elif c.error is not None:
        case.result = [Error(c.error, type_="run_failed")]
    elif c.failures:
        case.result = [Failure("; ".join(c.failures), type_="stack_failed")]
    case.system_out = "\n".join([*c.details, *map(finding_line, c.findings)]) + "\n"
    return case


def suite_junit(result: SuiteResult) -> JUnitXml:
    """The suite's JUnit document: one ``<testsuite name="zerowindow.suite">``."""
    suite = TestSuite("zerowindow.suite")
    suite.timestamp = datetime.now(UTC).isoformat(timespec="seconds")
    suite.add_property("run_dir", str(result.run_dir))
    for c in result.cases:
        suite.add_testcase(_case(c))
    suite.update_statistics()
    xml = JUnitXml("zerowindow")
    xml.add_testsuite(suite)
    return xml


def write_suite_junit(result: SuiteResult) -> Path:
    """Write :func:`suite_junit` to ``<suite run folder>/junit.xml``; return the path. Raises
    ``OSError`` if it cannot be written."""
    path = result.run_dir / SUITE_JUNIT
    suite_junit(result).write(str(path), pretty=True)
    return path


def print_suite(result: SuiteResult, *, console: Console | None = None) -> None:
    """One row per case: passed/FAILED/ERROR, why, and the findings."""
    console = console or Console(width=None if sys.stdout.isatty() else 160)
    table = Table(title="zerowindow suite", title_justify="left")
    for col in ("case", "result", "failures / error", "findings"):
        table.add_column(col)
    for c in result.cases:
        verdict = (
            "[yellow]skipped[/]" if c.skipped else "[bold red]ERROR[/]" if c.error else
            "[bold red]FAILED[/]" if c.failures else "[green]passed[/]"
        )  # fmt: skip
        why = (
            c.skipped or c.error or "; ".join(c.failures)
            or (c.details[-1] if "[" in c.name else "")
        )  # fmt: skip
        found = "\n".join(map(finding_line, c.findings))
        table.add_row(escape(c.name), verdict, escape(why), escape(found))
    console.print(table)
    passed = sum(c.passed for c in result.cases)
    skipped = sum(c.skipped is not None for c in result.cases)
    note = f", {skipped} not run" if skipped else ""
    console.print(f"{passed} of {len(result.cases)} cases passed{note}; "
                  f"results: {escape(str(result.run_dir))}")  # fmt: skip
