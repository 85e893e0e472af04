"""Do the gates flake, do they miss? Seeded trials of the A/A and A/B experiments.

Each trial ``i`` (seed ``i``): the baseline scenario runs (its repeats, relative gates
skipped) and is saved as a baseline (``zerowindow baseline save``); then the baseline scenario
runs again against it (A/A: nothing changed, so no gate may fail) and the candidate scenario
runs against it (A/B: the candidate is the regression, so its gates should fail). Each
trial's three runs go under ``<out>/trial-<i>/``. :class:`GateTrials` counts, per experiment,
the trials whose gates failed (any gate's verdict ``fail``), and each gate's verdicts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.gates import save_baseline
from harness.lifecycle._plan_run import run
from harness.lifecycle._results import PlanResult
from harness.scenario import RunOptions, Scenario


@dataclass
class Experiment:
    """One experiment's trials: how many ran, how many failed a gate, and per gate how often
    each verdict came out (``{"fast.itl_p50_ms <= 1.1 * baseline": {"fail": 19, ...}}``);
    ``runs`` are the trials' run folders."""

    trials: int = 0
    failed: int = 0
    verdicts: dict[str, Counter[str]] = field(default_factory=dict)
    runs: list[Path] = field(default_factory=list)

    def add(self, result: PlanResult) -> None:
        self.trials += 1
        self.failed += any(g.verdict == "fail" for g in result.gates)
        self.runs.append(result.run_dir)
        for g in result.gates:
            self.verdicts.setdefault(g.gate, Counter())[g.verdict] += 1

    def as_dict(self) -> dict[str, object]:
        return {
            "trials": self.trials,
            "failed": self.failed,
            "verdicts": {k: dict(v) for k, v in self.verdicts.items()},
        }


@dataclass
class GateTrials:
    """The A/A (``same``) and A/B (``changed``) experiments; ``errors`` lists trials that could
    not be judged (a run that did not complete), which count in neither."""

    same: Experiment = field(default_factory=Experiment)
    changed: Experiment = field(default_factory=Experiment)
    errors: list[str] = field(default_factory=list)


def run_gate_trials(
    baseline: Scenario,
    candidate: Scenario,
    *,
    trials: int,
    out_root: Path,
    first_seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> GateTrials:
    """Run ``trials`` seeded trials (module docstring) of ``candidate`` (A/B) and ``baseline``
    (A/A) against a baseline saved from ``baseline``, under ``out_root``. Never raises for a
    run that fails: the trial is listed in :attr:`GateTrials.errors`. Raises what
    :func:`~harness.lifecycle.run` raises before a run starts."""
    out = GateTrials()
    for i in range(first_seed, first_seed + trials):
        folder = out_root / f"trial-{i}"
        ref = run(
            baseline.model_copy(update={"seed": i}),
            RunOptions(use_baseline=False),
            out_root=folder / "base",
        )
        if ref.exit_code != 0:
            out.errors.append(f"trial {i}: the baseline run failed: {ref.failure}")
            continue
        base = save_baseline(ref.run_dir, folder / "baseline.json")
        for name, scenario, experiment in (
            ("A/A", baseline, out.same),
            ("A/B", candidate, out.changed),
        ):
            done = run(
                scenario.model_copy(update={"seed": i}),
                RunOptions(baseline=base),
                out_root=folder / name.replace("/", ""),
            )
            if any(r.summary.status != "complete" for r in done.runs.values()) or not done.runs:
                out.errors.append(f"trial {i} {name}: a run did not complete: {done.failure}")
                continue
            experiment.add(done)
            if progress is not None:
                verdicts = ", ".join(g.verdict for g in done.gates)
                progress(f"trial {i} {name}: {verdicts}")
    return out
