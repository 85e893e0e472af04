"""What running or analysing something returns: a run (:class:`RunResult`), one arm of a plan
over its runs (:class:`ArmResult`), and a plan (:class:`PlanResult`), each with its folder and
the exit code of :mod:`harness.lifecycle._exit`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.analysis import Comparison, SweepTable
from harness.gates import GateResult
from harness.runfolder import RunSummary, figures
from harness.scenario import Plan


@dataclass
class RunResult:
    """What a run produced: its folder, summary, the exit code `zerowindow run` returns, the
    scenario's gates evaluated and the baseline file they used (if any)."""

    run_dir: Path
    summary: RunSummary
    exit_code: int
    gates: list[GateResult] = field(default_factory=list)
    baseline: Path | None = None

    @property
    def figures(self) -> dict[str, float | None]:
        """The run's figures by name (see :mod:`harness.runfolder`)."""
        return figures(self.summary)

    @property
    def gates_passed(self) -> bool:
        """Whether every gate passed (true when there are none)."""
        return all(g.passed for g in self.gates)


@dataclass
class ArmResult:
    """One arm (configuration) of a plan over its runs: its ``name`` and folder, its repeats'
    and control runs' results (in order), each figure's estimate over the repeats
    (``estimates``: name -> value, low, high, per_repeat, method), the ``impact`` figures of a
    control arm, and the arm's gates, judged on all its runs."""

    name: str
    run_dir: Path
    runs: list[RunResult] = field(default_factory=list)
    controls: list[RunResult] = field(default_factory=list)
    estimates: dict[str, dict[str, Any]] = field(default_factory=dict)
    impact: dict[str, float | None] = field(default_factory=dict)
    gates: list[GateResult] = field(default_factory=list)

    @property
    def figures(self) -> dict[str, float | None]:
        """Each figure's estimate over the arm's runs, and the impact figures (the names gates
        use)."""
        return {**{n: e.get("value") for n, e in self.estimates.items()}, **self.impact}


@dataclass
class HistoryRecord:
    """What the end of a plan did with the history (``harness.history``): the file,
    the entries it added, and why it could not, if it could not."""

    path: Path
    added: int = 0
    error: str | None = None

    def line(self) -> str:
        """One line for the console."""
        if self.error:
            return f"history: not kept: {self.error}"
        return f"history: {self.added} entr{'y' if self.added == 1 else 'ies'} added to {self.path}"


@dataclass
class PlanResult:
    """What a plan produced (``harness.scenario.Plan``): its folder, every run by its folder
    relative to the plan's (``"."`` for a plan of one), each arm, the comparison or the sweep
    table where the plan has one, the baseline file relative gates used, and the exit code
    with why it is not 0."""

    plan: Plan
    run_dir: Path
    runs: dict[str, RunResult] = field(default_factory=dict)
    arms: dict[str, ArmResult] = field(default_factory=dict)
    comparison: Comparison | None = None
    sweep: SweepTable | None = None
    baseline: Path | None = None
    exit_code: int = 0
    failure: str | None = None
    history: HistoryRecord | None = None

    @property
    def gates(self) -> list[GateResult]:
        """Every arm's gates, in arm order (a sweep: every step's)."""
        if self.sweep is not None:
            return [g for r in self.runs.values() for g in r.gates]
        return [g for arm in self.arms.values() for g in arm.gates]

    def only_run(self) -> RunResult:
        """The plan's run, for a plan of one. Raises ``ValueError`` naming the plan's runs when
        it has several (then read :attr:`runs` or :attr:`arms`)."""
        if len(self.runs) != 1:
            raise ValueError(
                f"the {self.plan.kind} plan in {self.run_dir} has {len(self.runs)} runs "
                f"({', '.join(self.runs) or 'none'}): read .runs or .arms"
            )
        return next(iter(self.runs.values()))

    @property
    def summary(self) -> RunSummary:
        """The summary of a plan of one (:meth:`only_run`)."""
        return self.only_run().summary

    @property
    def figures(self) -> dict[str, float | None]:
        """A plan of one arm: its figures over its runs (:attr:`ArmResult.figures`). Raises
        ``ValueError`` for a plan of several arms."""
        if len(self.arms) != 1:
            raise ValueError(
                f"the plan in {self.run_dir} has {len(self.arms)} configurations "
                f"({', '.join(self.arms)}): read .arms[name].figures"
            )
        return next(iter(self.arms.values())).figures
