"""pytest plugin: run zerowindow scenarios from your own tests.

Installed with the toolkit (entry point ``pytest11``, name ``zerowindow``), it adds the fixture
``zerowindow_run``, a function that runs one scenario as ``zerowindow run`` does (its plan:
one run, repeats, a control arm, every configuration of its ``proxies``) and returns its
:class:`~harness.PlanResult`: ``run_dir``, ``exit_code`` (as ``zerowindow run``'s), ``gates``
(each a :class:`~harness.GateResult`, every configuration's), ``runs`` (each run's
:class:`~harness.RunResult` by its folder), ``arms`` (per configuration: its figures over its
repeats, with intervals, and its gates) and ``comparison``; for a plan of one run, ``summary``
(:class:`~harness.RunSummary`) and ``figures`` (the same names gates use) too::

    def test_fast_readers_keep_their_ttft(zerowindow_run):
        result = zerowindow_run(
            "scenarios/sim-coupled.toml",
            overrides={"target": {"engine": {"num_blocks": 128}}},
        )
        assert result.summary.status == "complete", result.summary.failure
        assert result.figures["fast.ttft_p99_ms"] < 500

    def test_every_proxy_keeps_the_slo(zerowindow_run):
        result = zerowindow_run("scenarios/sim-proxy-comparison.toml", repeats=2)
        for name, arm in result.arms.items():
            assert arm.figures["fast.ttft_p99_ms"] < 500, name

    def test_scenario_gates(zerowindow_run):
        zerowindow_run("scenarios/my-slo.toml", check=True)   # fails the test on a failed gate

``zerowindow_run(scenario, *, overrides=None, out=None, target_url=None, baseline=None,
repeats=None, check=False)``:

- ``scenario``: a scenario file (a relative path is taken from pytest's rootdir) or a
  :class:`~harness.Scenario`;
- ``overrides``: values merged into the file's tables before validation;
- ``out``: the folder that receives the run folder (default ``--zerowindow-out``, else the
  test's ``tmp_path``);
- ``target_url``: attach to a running server (default ``--zerowindow-target-url``);
- ``baseline``: baseline file for relative gates (default
  ``<rootdir>/results/baselines/<scenario>.json``);
- ``repeats``: as ``zerowindow run --repeats``;
- ``check``: fail the test, listing the failed runs and gates, when the exit code is not 0.

An invalid scenario, or a pair of options that does not compose, raises
:class:`~harness.ScenarioError` and a missing baseline :class:`~harness.BaselineError`, both
before anything starts. Each plan's folder is added to the test's ``user_properties``
(``zerowindow_run_dir``), so pytest's own ``--junitxml`` report names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the harness is imported when a test uses the fixture, not at pytest start
    from harness.lifecycle import PlanResult
    from harness.scenario import Scenario


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("zerowindow", "zerowindow scenario runs")
    group.addoption(
        "--zerowindow-out",
        default=None,
        metavar="DIR",
        help="folder that receives the run folders of zerowindow_run (default: tmp_path)",
    )
    group.addoption(
        "--zerowindow-target-url",
        default=None,
        metavar="URL",
        help="run every scenario against this running server instead of its own target",
    )


class ScenarioRunner:
    """The callable the ``zerowindow_run`` fixture returns (see the module docstring)."""

    def __init__(self, request: pytest.FixtureRequest, default_out: Path) -> None:
        self._request = request
        self._root = request.config.rootpath
        out = request.config.getoption("zerowindow_out")
        self._out = Path(out) if out else default_out
        self._target_url: str | None = request.config.getoption("zerowindow_target_url")
        self.results: list[PlanResult] = []

    def __call__(
        self,
        scenario: str | Path | Scenario,
        *,
        overrides: Mapping[str, Any] | None = None,
        out: str | Path | None = None,
        target_url: str | None = None,
        baseline: str | Path | None = None,
        repeats: int | None = None,
        check: bool = False,
    ) -> PlanResult:
        from harness.gates import baseline_path
        from harness.lifecycle import run_plan
        from harness.scenario import RunOptions, Scenario, load_scenario, make_plan, needs_baseline

        path: Path | None = None
        if isinstance(scenario, Scenario):
            if overrides:
                raise TypeError("overrides apply to scenario files; use Scenario.model_copy")
            config = scenario
        else:
            path = Path(scenario)
            path = path if path.is_absolute() else self._root / path
            config = load_scenario(path, overrides=overrides)
        if baseline is None and needs_baseline(config.gates):
            baseline = self._root / baseline_path(config.name)
        options = RunOptions(
            target_url=target_url or self._target_url,
            baseline=Path(baseline) if baseline else None,
            repeats=repeats,
        )
        plan = make_plan(config, options, scenario_path=path)
        result = run_plan(plan, out_root=Path(out) if out else self._out)
        self.results.append(result)
        self._request.node.user_properties.append(("zerowindow_run_dir", str(result.run_dir)))
        if check and result.exit_code != 0:
            pytest.fail(failure_report(result), pytrace=False)
        return result


def failure_report(result: PlanResult) -> str:
    """Why a plan did not pass, one line per problem: each run that failed and each failed
    gate (with its configuration, in a comparison)."""
    lines = [f"zerowindow run {result.run_dir} exited {result.exit_code}"]
    if result.failure and not result.runs:
        lines.append(f"  {result.failure}")
    for path, run in result.runs.items():
        if run.summary.failure:
            where = "run" if path == "." else f"run {path}"
            lines.append(f"  {where} {run.summary.status}: {run.summary.failure}")
    for name, arm in result.arms.items():
        where = f"{name}: " if len(result.arms) > 1 else ""
        lines += [f"  {where}gate {g.gate!r} failed: {g.reason}" for g in arm.gates if not g.passed]
    return "\n".join(lines)


@pytest.fixture
def zerowindow_run(request: pytest.FixtureRequest, tmp_path: Path) -> ScenarioRunner:
    """Run a zerowindow scenario and return its :class:`~harness.PlanResult` (see
    :mod:`harness.pytest_plugin`)."""
    return ScenarioRunner(request, tmp_path / "zerowindow")
