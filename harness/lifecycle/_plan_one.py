"""A plan of one: one run in its own folder, the target started and stopped with it."""

from __future__ import annotations

from pathlib import Path

from harness.lifecycle._conclude import conclude
from harness.lifecycle._conclude_plan import BaselineFile
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._results import RunResult
from harness.lifecycle._run import RunLifecycle, RunPlan, open_run_dir
from harness.scenario import Plan


def run_one(
    plan: Plan,
    setup: RunPlan,
    base: BaselineFile,
    *,
    out_root: Path,
    distribution: Distribution | None,
    history: Path | None = None,
) -> RunResult:
    """Run the one run of ``plan`` (as ``setup`` planned it; ``base``: the baseline of its
    relative gates; ``history``: the history file of its history gates) into
    ``out_root/<name>/<UTC timestamp>/``. Never raises for failures of
    the target or the load: they are recorded in ``run.json`` and ``summary.json`` and set
    :attr:`RunResult.exit_code`. Raises ``OSError`` if the folder cannot be written."""
    scenario = setup.scenario
    path = Path(plan.scenario_path) if plan.scenario_path else None
    run_dir = open_run_dir(out_root, scenario, path)
    run = RunLifecycle(
        scenario,
        path,
        run_dir,
        setup.target,
        network=setup.network,
        distribution=distribution,
        placement=setup.placement,
    )
    if plan.options.progress:
        run.progress = RunProgress()
        run.progress.start(
            scenario=scenario.name, run_dir=run_dir,
            groups=[g.name for g in scenario.groups], max_duration_s=scenario.max_duration_s,
        )  # fmt: skip
    try:
        facts = run.execute()
    finally:
        if run.progress is not None:
            run.progress.stop()
    skip = not plan.options.use_baseline
    return conclude(
        run_dir, facts, run.info, setup_failed=run.setup_failed, baseline=base, skip_relative=skip,
        history=history,
    )  # fmt: skip
