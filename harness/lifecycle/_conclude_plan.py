"""The end of a plan of several runs, and all of ``zerowindow analyze PARENT``: the aggregate of
the runs' folders (``harness.analysis._aggregate``) → the gates of each arm → the files.

:func:`conclude_plan` writes, for each pooled arm (``harness.scenario._plan``), into the arm's
folder: ``repeats.json`` (its runs, each figure's estimate with its interval, the impact of a
control arm, the gates), ``gates.json`` and ``junit.xml``; for a comparison, into the plan's
folder: ``comparison.json`` and ``comparison.md`` (the configurations side by side, with
intervals), ``gates.json`` (every configuration's gates) and ``junit.xml`` (one test suite per
configuration); for a sweep: ``sweep.json``, ``sweep.md``, ``sweep.html``; in every case the
end of ``plan.json`` (status, exit code) and the plan's ``report.html``. Given the same folders
it writes the same files (timestamps aside): the bootstrap is seeded.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from harness.analysis import (
    ArmAggregate,
    PlanRecord,
    arm_aggregate,
    comparison_of,
    sweep_of,
)
from harness.gates import Baseline, GateResult, evaluate_gates
from harness.history import Past, plan_past
from harness.lifecycle._exit import decide
from harness.lifecycle._results import ArmResult, PlanResult, RunResult
from harness.outputs import (
    Concluded,
    JunitSuite,
    write_comparison,
    write_outputs,
    write_sweep,
)
from harness.runfolder import (
    BASELINE_JSON,
    GATES_JSON,
    PLAN_JSON,
    REPEATS_JSON,
    write_json,
)
from harness.scenario import Plan

BaselineFile = tuple[Path, Baseline] | None


def judge_arm(
    plan: Plan,
    arm: ArmAggregate,
    baseline: BaselineFile,
    *,
    skip_relative: bool = False,
    final: bool = True,
    past: Past | None = None,
) -> list[GateResult]:
    """The scenario's gates on ``arm``'s figures over its runs and their evidence, against
    ``baseline`` (``harness.gates._evaluate``) and, for history gates, ``past``;
    ``final=False`` while a rerun may still come."""
    return evaluate_gates(
        plan.scenario.gates,
        arm.figures,
        baseline[1].figures if baseline else None,
        baseline_source=f"baseline {baseline[0]}" if baseline else "the baseline",
        skip_relative=skip_relative,
        evidence=arm.evidence,
        baseline_evidence=baseline[1].evidence(baseline[0]) if baseline else None,
        policy=plan.scenario.gating,
        final=final,
        past=past,
    )


def _gates_record(
    gates: list[GateResult], baseline: BaselineFile, skip_relative: bool, **extra: Any
) -> dict[str, Any]:
    return {
        "baseline": str(baseline[0]) if baseline else None,
        "baseline_provenance": baseline[1].provenance if baseline else None,
        "skipped_relative": skip_relative,
        **extra,
        "gates": [vars(g) for g in gates],
    }


def _suite_name(plan: Plan, arm: str | None) -> str:
    """A configuration's test suite (``arm``), or the plan's own (None: no run began)."""
    name = f"zerowindow.{plan.scenario.name}"
    return f"{name}.{arm}" if plan.kind == "comparison" and arm is not None else name


def _junit_unit(plan: Plan, agg: ArmAggregate, gates: list[GateResult]) -> JunitSuite:
    duration = sum(s.duration_s for s in agg.summaries)
    failure = next((s.failure for s in agg.summaries if s.status != "complete"), None)
    props = {"run_dir": str(agg.folder), "status": agg.status, "repeats": str(len(agg.runs))}
    return JunitSuite(_suite_name(plan, agg.arm.name), agg.status, failure, duration, gates, props)


def _write_arm(
    plan: Plan, agg: ArmAggregate, gates: list[GateResult], base: BaselineFile, skip: bool
) -> None:
    """The pooled arm's files in its folder (module docstring)."""
    names = [r.name for r in agg.runs]
    write_json(
        agg.folder / REPEATS_JSON,
        {
            "repeats": len(agg.runs),
            "runs": names,
            "controls": [c.name for c in agg.controls],
            "confidence": plan.confidence,
            "bootstrap_draws": plan.bootstrap_draws,
            "figures": {n: e.as_dict() for n, e in agg.estimates.items()},
            "impact": agg.impact,
            "gates": [vars(g) for g in gates],
        },
    )
    write_json(agg.folder / GATES_JSON, _gates_record(gates, base, skip, repeats=names))
    if agg.arm.folder:  # a configuration's own folder; the plan's folder gets the plan's
        for warning in write_outputs(Concluded(agg.folder, [_junit_unit(plan, agg, gates)], False)):
            print(warning, file=sys.stderr)


def _arm_result(
    agg: ArmAggregate, leaves: dict[str, RunResult], folder: Path, gates: list[GateResult]
) -> ArmResult:
    def result(path: Path) -> RunResult:
        return leaves[str(path.relative_to(folder)) if path != folder else "."]

    return ArmResult(
        name=agg.arm.name,
        run_dir=agg.folder,
        runs=[result(p) for p in agg.runs],
        controls=[result(p) for p in agg.controls],
        estimates={n: e.as_dict() for n, e in agg.estimates.items()},
        impact=agg.impact,
        gates=gates,
    )


def conclude_plan(
    folder: Path,
    record: PlanRecord,
    leaves: dict[str, RunResult],
    *,
    baseline: BaselineFile = None,
    skip_relative: bool = False,
    keep_baseline: bool = True,
    history: Path | None = None,
) -> PlanResult:
    """Aggregate, gate and write the plan in ``folder`` (module docstring); ``leaves`` are its
    runs' results by path, ``record`` its ``plan.json``. ``baseline`` is the baseline relative
    gates compare with (``skip_relative``: they are skipped); ``keep_baseline`` copies it into
    the folder (``baseline.json``, what ``zerowindow analyze`` compares with again);
    ``history`` is the history file history gates read (recorded in ``plan.json``)."""
    plan = record.plan
    result = PlanResult(plan, folder, dict(leaves), baseline=baseline[0] if baseline else None)
    statuses = [r.summary.status for r in leaves.values()]
    gates: list[GateResult] = []
    units: list[JunitSuite] = []
    if plan.kind == "sweep":
        result.sweep = sweep_of(folder, record)
        write_sweep(
            {**result.sweep.as_dict(), "failure": record.info.get("failure")},
            folder, title=plan.scenario.name,
        )  # fmt: skip
    else:
        aggs = {a.name: arm_aggregate(folder, record, a) for a in plan.arms if record.of_arm(a)}
        for name, agg in aggs.items():
            if plan.pooled:
                past = plan_past(history, folder, record, agg.arm)
                arm_gates = judge_arm(plan, agg, baseline, skip_relative=skip_relative, past=past)
                _write_arm(plan, agg, arm_gates, baseline, skip_relative)
            else:  # an arm of one run: gated as a run, on its own (its gates.json)
                arm_gates = leaves[record.of_arm(agg.arm)[0].path].gates
            result.arms[name] = _arm_result(agg, leaves, folder, arm_gates)
            units.append(_junit_unit(plan, agg, arm_gates))
            gates += arm_gates
        if plan.kind == "comparison" and aggs:
            result.comparison = comparison_of(plan, aggs)
            write_comparison(result.comparison, folder, title=plan.scenario.name)
            arms = {n: [vars(g) for g in a.gates] for n, a in result.arms.items()}
            record_gates = _gates_record(gates, baseline, skip_relative, arms=arms)
            write_json(folder / GATES_JSON, record_gates)
    if keep_baseline and baseline is not None:
        write_json(folder / BASELINE_JSON, baseline[1].model_dump(mode="json"))
    info = record.info
    info["history"] = str(history) if history else None
    result.failure = info.get("failure")
    result.exit_code = decide(
        statuses + [info.get("status", "complete")] * (not leaves),
        gates,
        setup_failed=bool(info.get("setup_failed")),
        interrupted=info.get("status") == "interrupted",
    )
    if result.failure is None and result.exit_code:
        result.failure = _why(result)
    if not units and plan.kind != "sweep" and result.exit_code:  # no run began: CI sees why
        status = info["status"] if info.get("status", "complete") != "complete" else "failed"
        props = {"run_dir": str(folder), "status": status}
        units.append(JunitSuite(_suite_name(plan, None), status, result.failure, 0.0, [], props))
    data = record.as_dict()
    # Last, whether the run or a later analyze writes them: the exit code, then what the
    # history took of the plan (harness.lifecycle._history adds it after this).
    tail = {k: data.pop(k) for k in ("exit_code", "history_added", "history_error") if k in data}
    tail["exit_code"] = result.exit_code
    write_json(folder / PLAN_JSON, {**data, "exit_code": result.exit_code, **tail})
    for warning in write_outputs(Concluded(folder, units)):
        print(warning, file=sys.stderr)
    return result


def _why(result: PlanResult) -> str | None:
    """Why a plan's exit code is not 0 when no run stopped it: a run that failed, or gates."""
    for path, run in result.runs.items():
        if run.summary.status != "complete":
            return f"{path}: run {run.summary.status}: {run.summary.failure}"
    failed = [
        f"{name}: {g.gate}" if len(result.arms) > 1 else g.gate
        for name, arm in result.arms.items()
        for g in arm.gates
        if not g.passed
    ]
    return f"gates failed: {', '.join(failed)}" if failed else None
