"""Running a plan: the one way every command, the pytest plugin and the Python API run
something.

:func:`run` makes the plan of a scenario and its options (:func:`harness.scenario.make_plan`,
which refuses pairs of options that do not compose) and :func:`run_plan` runs it: before
anything starts it settles the target (``--target-url``), the network, the CPU placement, the
Locust distribution and the baseline; then a plan of one runs as a run (its folder is the run
folder), any other as a series against one target (``harness.lifecycle._series``) whose body
runs the arms' repeats round the arms, each repeat's control run after it, and more repeats
while an arm's gates are inconclusive under the rerun policy, or a sweep's steps
(``harness.lifecycle._sweep``). The plan's aggregate is then concluded
(``harness.lifecycle._conclude_plan``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.analysis import arm_aggregate
from harness.gates import wants_rerun
from harness.history import history_path, plan_past
from harness.lifecycle._conclude_plan import BaselineFile, conclude_plan, judge_arm
from harness.lifecycle._distributed import Distribution, check_listen_address, parse_address
from harness.lifecycle._history import remember
from harness.lifecycle._inputs import baseline_for
from harness.lifecycle._plan_one import run_one
from harness.lifecycle._results import ArmResult, PlanResult, RunResult
from harness.lifecycle._run import open_run_dir, plan_run
from harness.lifecycle._series import Series, run_series
from harness.lifecycle._sweep import SweepBody
from harness.scenario import Arm, NamedProxyConfig, Plan, RunOptions, Scenario, make_plan
from zwcore import ScenarioError


def distribution_of(options: RunOptions) -> Distribution | None:
    """The Locust distribution ``options`` ask for (``None``: one process per group). Raises
    :class:`~harness.lifecycle.DistributedError` for a ``master_bind`` this machine cannot
    listen on."""
    if not (options.workers or options.remote_workers):
        return None
    host, port = parse_address(options.master_bind, default_port=0)
    check_listen_address(host)
    return Distribution(options.workers, options.remote_workers, host, port)


def _leaf(scenario: Scenario, *, gated: bool) -> Scenario:
    """A run of a plan as its own scenario: one run, no control arm; ungated inside a pooled
    arm (the arm is gated on all its runs)."""
    update = {"repeats": 1, "control": False}
    return scenario.model_copy(update=update if gated else {**update, "gates": []})


def _arms_body(plan: Plan, base: BaselineFile, history: Path | None) -> Callable[[Series], None]:
    """Run each arm's repeats round the arms, each with its control run, then reruns."""

    def body(series: Series) -> None:
        scenario = series.scenario
        runs = _leaf(scenario, gated=not plan.pooled)
        control = _leaf(scenario, gated=False).model_copy(
            update={"groups": [g for g in scenario.groups if not g.aggressor]}
        )
        proxies = {p.name: p for p in scenario.proxies}

        def one(arm: Arm, index: int) -> None:
            proxy: NamedProxyConfig | None = proxies.get(arm.name) if proxies else None
            series.run(plan.entry(arm, "repeat", index), runs, proxy)
            if plan.control:
                series.run(plan.entry(arm, "control", index), control, proxy)

        for index in range(1, plan.repeats + 1):
            for arm in plan.arms:
                one(arm, index)
        skip = not plan.options.use_baseline
        for extra in range(1, plan.max_reruns + 1):
            wanting = [
                arm for arm in plan.arms
                if wants_rerun(
                    judge_arm(plan, arm_aggregate(series.run_dir, series.record, arm), base,
                              skip_relative=skip, final=False,
                              past=plan_past(history, series.run_dir, series.record, arm)),
                    plan.scenario.gating,
                )
            ]  # fmt: skip
            for arm in wanting:
                one(arm, plan.repeats + extra)
            if not wanting:
                return

    return body


def run_plan(
    plan: Plan, *, out_root: Path = Path("results"), history_root: Path | None = None
) -> PlanResult:
    """Run ``plan`` (module docstring) under ``out_root/<scenario>/<UTC timestamp>/`` and
    return its :class:`PlanResult`; its runs are added to the history
    (:func:`harness.history.history_path`: by default ``history.duckdb`` in ``history_root``,
    default ``out_root``). Never raises for failures of the target, a proxy, the
    network or the load once something started: they are recorded and set the exit code
    (``harness.lifecycle._exit``). Raises, before anything starts,
    :class:`~zwcore.ScenarioError` for a ``--target-url`` that is no URL, a target that cannot
    run in the scenario's network or CPUs that are not usable,
    :class:`~harness.lifecycle.DistributedError` for a distribution that cannot run here,
    :class:`~harness.BaselineError` for a baseline that is needed and cannot be loaded, and
    ``OSError`` for a results folder that cannot be written."""
    options = plan.options
    distribution = distribution_of(options)
    setup = plan_run(plan.scenario, target_url=options.target_url, distribution=distribution)
    base = baseline_for(plan.scenario, options.baseline, use=options.use_baseline)
    history = history_path(
        options.history, options.use_history, plan.scenario.history, history_root or out_root
    )
    path = Path(plan.scenario_path) if plan.scenario_path else None
    if plan.single:
        leaf = run_one(
            plan, setup, base, out_root=out_root, distribution=distribution, history=history
        )
        arm = plan.arms[0]
        result = PlanResult(plan, leaf.run_dir, {".": leaf}, baseline=leaf.baseline)
        estimates = {n: {"value": v} for n, v in leaf.figures.items()}
        result.arms[arm.name] = ArmResult(
            arm.name, leaf.run_dir, [leaf], estimates=estimates, gates=leaf.gates
        )
        result.exit_code = leaf.exit_code
        result.failure = leaf.summary.failure
        return remember(result, history)
    run_dir = open_run_dir(out_root, setup.scenario, path)
    body = _arms_body(plan, base, history) if options.sweep is None else SweepBody(options.sweep)
    series = run_series(plan, setup, run_dir, body, distribution=distribution, history=history)
    skip = not options.use_baseline
    result = conclude_plan(
        run_dir, series.record, series.results, baseline=base, skip_relative=skip, history=history
    )
    return remember(result, history)


def run(
    scenario: Scenario,
    options: RunOptions | None = None,
    *,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
) -> PlanResult:
    """Make the plan of ``scenario`` with ``options`` and run it (:func:`run_plan`). Raises
    what :func:`~harness.scenario.make_plan` and :func:`run_plan` raise, before anything
    starts."""
    return run_plan(make_plan(scenario, options, scenario_path=scenario_path), out_root=out_root)


def run_scenario(
    scenario: Scenario,
    *,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    **options: Any,
) -> RunResult:
    """Run ``scenario`` as a plan of one and return its run (``options``: the fields of
    :class:`~harness.scenario.RunOptions`, such as ``target_url`` or ``workers``). Raises
    :class:`~zwcore.ScenarioError` when the scenario and options make a plan of several runs
    (repeats, a control arm, a rerun policy, proxies: run those with :func:`run`), and what
    :func:`run` raises."""
    plan = make_plan(scenario, RunOptions(**options), scenario_path=scenario_path)
    if not plan.single:
        raise ScenarioError(
            f"run_scenario with a {plan.kind} plan ({len(plan.arms)} configuration(s), "
            f"{plan.repeats} repeat(s), control {plan.control}): it returns one run; "
            "use harness.run(), which returns the plan's result"
        )
    return run_plan(plan, out_root=out_root).only_run()
