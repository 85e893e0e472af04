"""``zerowindow analyze FOLDER``: any folder the toolkit wrote, analysed again from what it
recorded (a folder copied off another machine, or an analysis fix applied to old runs).

A run folder is concluded again (``harness.lifecycle._conclude``); a plan's folder
(``plan.json``: repeats, control runs, a comparison, a sweep) has each of its runs concluded
again, then its aggregate (``harness.lifecycle._conclude_plan``); a suite's folder
(``suite.json``) has each incident's folder analysed again, then its cases and ``junit.xml``
(``harness.lifecycle._suite``). On an unchanged folder every file is reproduced (timestamps
aside).
"""

from __future__ import annotations

from pathlib import Path

from harness.analysis import is_plan_folder, killed_plan_end, read_facts, read_plan
from harness.gates import Baseline
from harness.lifecycle._conclude import reanalyze_run, recorded_baseline
from harness.lifecycle._conclude_plan import BaselineFile, conclude_plan
from harness.lifecycle._results import ArmResult, PlanResult
from harness.outputs import SuiteResult
from harness.runfolder import REPEATS_JSON, SUITE_JSON
from harness.scenario import needs_baseline, plan_of_one
from zwcore import RunFolderError


def reanalyze(
    folder: Path, *, baseline: tuple[Path, Baseline] | None = None, use_baseline: bool = True
) -> PlanResult | SuiteResult:
    """Analyse ``folder`` again (module docstring). Relative gates compare with ``baseline``
    if given, else with the baseline the folder was gated against (its copy
    ``baseline.json``); with ``use_baseline=False`` they are skipped. Raises
    :class:`~zwcore.RunFolderError` for a folder the toolkit did not write (or a file of it
    that cannot be read) and :class:`~harness.BaselineError` for a baseline that is needed and
    cannot be loaded."""
    if (folder / SUITE_JSON).is_file():
        from harness.lifecycle._suite import reanalyze_suite

        return reanalyze_suite(folder, baseline=baseline, use_baseline=use_baseline)
    if is_plan_folder(folder):
        return reanalyze_plan(folder, baseline=baseline, use_baseline=use_baseline)
    if (folder / REPEATS_JSON).is_file() and is_plan_folder(folder.parent):
        raise RunFolderError(
            f"{folder}: one configuration of the plan in {folder.parent}; its aggregate is "
            f"the plan's: zerowindow analyze {folder.parent}"
        )
    run = reanalyze_run(folder, baseline=baseline, use_baseline=use_baseline)
    facts = read_facts(folder)
    plan = plan_of_one(facts.scenario, arm=facts.proxy_name)
    result = PlanResult(plan, folder, {".": run}, baseline=run.baseline)
    estimates = {n: {"value": v} for n, v in run.figures.items()}
    arm = plan.arms[0].name
    result.arms[arm] = ArmResult(arm, folder, [run], estimates=estimates, gates=run.gates)
    result.exit_code, result.failure = run.exit_code, run.summary.failure
    return result


def _plan_baseline(
    folder: Path, needed: bool, baseline: BaselineFile, use_baseline: bool, name: str
) -> tuple[BaselineFile, bool]:
    """The baseline a plan's pooled gates compare with again, and whether they are skipped."""
    if not use_baseline:
        return None, True
    if baseline is not None or not needed:
        return baseline, False
    return recorded_baseline(folder, name)


def reanalyze_plan(
    folder: Path, *, baseline: BaselineFile = None, use_baseline: bool = True
) -> PlanResult:
    """A plan's folder analysed again: each run, then the aggregate (module docstring)."""
    record = read_plan(folder)
    plan = record.plan
    if record.info.get("status") == "running":  # its harness was killed (or still runs)
        recorded = [e.path for e in record.runs]
        status, failure = killed_plan_end(folder, record.info, recorded)
        record.info.update(status=status, failure=failure)
    leaves = {
        e.path: reanalyze_run(folder / e.path, baseline=baseline, use_baseline=use_baseline)
        for e in record.runs
    }
    needed = plan.pooled and needs_baseline(plan.scenario.gates)
    base, skip = _plan_baseline(folder, needed, baseline, use_baseline, plan.scenario.name)
    history = Path(record.info["history"]) if record.info.get("history") else None
    return conclude_plan(
        folder, record, leaves, baseline=base, skip_relative=skip, keep_baseline=False,
        history=history,
    )  # fmt: skip
