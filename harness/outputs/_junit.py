"""``junit.xml``: a run's gates as JUnit test cases, for CI systems (GitHub, GitLab, Jenkins).

One ``<testsuite name="zerowindow.<scenario>">`` with one ``<testcase>`` per gate, named by the
gate's text; a failed gate carries ``<failure message="...">`` with the measured value and the
bound; a relative gate run without a baseline on purpose (``--no-baseline``) is
``<skipped>``. A run that did not complete adds a test case ``run`` with an ``<error>`` giving the
reason, so that a CI system shows why even when no gate is declared. Written with
``junitparser`` (https://github.com/weiwei/junitparser).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Skipped, TestCase, TestSuite

from harness.gates._evaluate import GateResult
from harness.runfolder import RunSummary


def junit_xml(
    summary: RunSummary,
    gates: list[GateResult],
    *,
    run_dir: Path,
    baseline: Path | None = None,
) -> JUnitXml:
    """The JUnit document of one run (see the module docstring)."""
    suite = TestSuite(f"zerowindow.{summary.scenario}")
    suite.timestamp = datetime.now(UTC).isoformat(timespec="seconds")
    suite.add_property("run_dir", str(run_dir))
    suite.add_property("status", summary.status)
    if baseline is not None:
        suite.add_property("baseline", str(baseline))
    classname = f"zerowindow.{summary.scenario}.gates"
    for result in gates:
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
    if summary.status != "complete":
        case = TestCase("run", classname=f"zerowindow.{summary.scenario}", time=0.0)
        case.result = [Error(f"run {summary.status}: {summary.failure}", type_="run_failed")]
        suite.add_testcase(case)
    suite.update_statistics()
    suite.time = round(summary.duration_s, 3)  # after update_statistics, which sums the cases
    xml = JUnitXml("zerowindow")
    xml.add_testsuite(suite)
    return xml


def write_junit(
    path: Path,
    summary: RunSummary,
    gates: list[GateResult],
    *,
    run_dir: Path,
    baseline: Path | None = None,
) -> None:
    """Write :func:`junit_xml` to ``path``. Raises ``OSError`` if it cannot be written."""
    junit_xml(summary, gates, run_dir=run_dir, baseline=baseline).write(str(path), pretty=True)
