"""``junit.xml``: gates as JUnit test cases, for CI systems (GitHub, GitLab, Jenkins).

One ``<testsuite>`` per gated unit: a run (``zerowindow.<scenario>``), or each configuration
of a plan (``zerowindow.<scenario>.<configuration>``, gated on all its repeats), with one
``<testcase>`` per gate, named by the gate's text; a failed gate carries ``<failure
message="...">`` with the measured value, the bound and their intervals; a relative gate run
without a baseline on purpose (``--no-baseline``) is ``<skipped>``. A unit that did not
complete adds a test case ``run`` with an ``<error>`` giving the reason, so that a CI system
shows why even when no gate is declared. Written with ``junitparser``
(https://github.com/weiwei/junitparser).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from harness.gates import GateResult
from harness.runfolder import RunSummary


@dataclass(frozen=True)
class JunitSuite:
    """One ``<testsuite>``: its ``name``, the unit's ``status`` and ``failure``, its duration
    (s), gates and properties (``run_dir``, ``baseline`` ...)."""

    name: str
    status: str
    failure: str | None
    duration_s: float
    gates: Sequence[GateResult]
    properties: Mapping[str, str] = field(default_factory=dict)


def junit_run(
    summary: RunSummary, gates: Sequence[GateResult], *, run_dir: Path, baseline: Path | None
) -> JunitSuite:
    """The test suite of one run."""
    props = {"run_dir": str(run_dir), "status": summary.status}
    if baseline is not None:
        props["baseline"] = str(baseline)
    return JunitSuite(
        f"zerowindow.{summary.scenario}", summary.status, summary.failure, summary.duration_s,
        gates, props,
    )  # fmt: skip


def _suite(unit: JunitSuite) -> TestSuite:
    suite = TestSuite(unit.name)
    suite.timestamp = datetime.now(UTC).isoformat(timespec="seconds")
    for key, value in unit.properties.items():
        suite.add_property(key, value)
    classname = f"{unit.name}.gates"
    for result in unit.gates:
        case = TestCase(result.gate, classname=classname, time=0.0)
        if result.skipped:
            case.result = [Skipped(result.reason)]
        elif not result.passed:
            case.result = [Failure(f"{result.gate}: {result.reason}", type_="gate_failed")]
        case.system_out = (
            f"figure={result.figure} measured={result.measured} op={result.op} "
            f"bound={result.bound} baseline={result.baseline}\n{result.reason}\n"
        )
        suite.add_testcase(case)
    if unit.status != "complete":
        case = TestCase("run", classname=unit.name, time=0.0)
        case.result = [Error(f"run {unit.status}: {unit.failure}", type_="run_failed")]
        suite.add_testcase(case)
    suite.update_statistics()
    suite.time = round(unit.duration_s, 3)  # after update_statistics, which sums the cases
    return suite


def junit_xml(units: Sequence[JunitSuite]) -> JUnitXml:
    """The JUnit document of ``units`` (see the module docstring)."""
    xml = JUnitXml("zerowindow")
    for unit in units:
        xml.add_testsuite(_suite(unit))
    return xml


def write_junit(path: Path, units: Sequence[JunitSuite]) -> None:
    """Write :func:`junit_xml` to ``path``. Raises ``OSError`` if it cannot be written."""
    junit_xml(units).write(str(path), pretty=True)
