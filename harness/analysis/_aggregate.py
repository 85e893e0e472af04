"""A plan's aggregate: a pure function of the run folders beneath the plan's folder.

``plan.json`` (:class:`PlanRecord`) says what the plan was and which runs it made, where; from
their folders (each a complete run folder, analysed) this module derives, for each arm
(configuration) of the plan, its :class:`~harness.analysis.Evidence`, each figure's estimate
with its interval, and with a control arm the aggressors' impact (:class:`ArmAggregate`); for a
comparison, the configurations side by side (:func:`comparison_of`); for a sweep, its table
(:func:`harness.analysis._sweep.sweep_table`). Every interval takes the plan's one setting of
``confidence`` and ``bootstrap_draws``. Nothing here writes: ``harness.lifecycle`` gates the
aggregate and writes it, after a plan's runs and again for ``zerowindow analyze PARENT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.analysis._comparison import ArmFigures, Comparison, compare
from harness.analysis._sweep import SweepTable, sweep_point, sweep_table
from harness.analysis._uncertainty import Estimate, Evidence, estimate, evidence_of, impact
from harness.runfolder import (
    PLAN_JSON,
    REPEATS_JSON,
    RUN_JSON,
    SUMMARY_JSON,
    RunSummary,
    figures,
    kept_plugins,
    read_json,
)
from harness.scenario import Arm, Plan, RunEntry
from loadgen import FullSpeed, RateArrivals
from zwcore import RunFolderError


@dataclass(frozen=True)
class PlanRecord:
    """``plan.json``: the :class:`~harness.scenario.Plan`, the runs it made (in run order) and
    the rest of what its life cycle recorded (``info``: versions, host, warm-up, target,
    exit code ...)."""

    plan: Plan
    runs: list[RunEntry]
    info: dict[str, Any] = field(default_factory=dict)

    def of_arm(self, arm: Arm, role: str = "repeat") -> list[RunEntry]:
        """The runs of ``arm`` in ``role`` (``repeat``, ``control`` or ``step``), in order."""
        return [e for e in self.runs if e.arm == arm.name and e.role == role]

    def as_dict(self) -> dict[str, Any]:
        """The record as ``plan.json`` holds it."""
        return {
            **self.info,
            "plan": self.plan.model_dump(mode="json"),
            "runs": [e.model_dump(mode="json") for e in self.runs],
        }


def is_plan_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a plan of several runs (a ``plan.json``)."""
    return (folder / PLAN_JSON).is_file()


def read_plan(folder: Path) -> PlanRecord:
    """The :class:`PlanRecord` of a plan's folder. A file plugin the scenario names that is no
    longer where the plan found it is taken from the folder's copy (``plugins/``). Raises
    :class:`~zwcore.RunFolderError` naming the file and the field that is missing or invalid."""
    path = folder / PLAN_JSON
    info = read_json(path)
    try:
        raw = dict(info.pop("plan"))
        scenario = dict(raw["scenario"])
        scenario["plugins"] = kept_plugins(folder, list(scenario.get("plugins", [])))
        plan = Plan.model_validate({**raw, "scenario": scenario})
        runs = [RunEntry.model_validate(e) for e in info.pop("runs", [])]
    except (KeyError, TypeError) as exc:
        raise RunFolderError(f"{path}: not a zerowindow plan (no {exc})") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise RunFolderError(f"{path}: {where}: {err['msg']}") from None
    return PlanRecord(plan, runs, info)


def read_summary(run_dir: Path) -> RunSummary:
    """The summary of a run folder. Raises :class:`~zwcore.RunFolderError` naming the file."""
    path = run_dir / SUMMARY_JSON
    try:
        return RunSummary.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise RunFolderError(f"{path}: cannot read the run's summary: {exc.strerror}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise RunFolderError(f"{path}: {where}: {err['msg']} (an older zerowindow?)") from None


@dataclass(frozen=True)
class ArmAggregate:
    """One arm over its runs: its folder, the folders of its repeats and control runs, their
    evidence, each figure's :class:`~harness.analysis.Estimate` (``estimates``) and, with a
    control arm, the ``impact`` figures (``impact.<group>.<figure>`` with ``_low``/``_high``)."""

    arm: Arm
    folder: Path
    runs: list[Path]
    controls: list[Path]
    summaries: list[RunSummary]
    evidence: Evidence
    estimates: dict[str, Estimate]
    impact: dict[str, float | None]

    @property
    def figures(self) -> dict[str, float | None]:
        """What the arm's gates read: each figure's estimate over the runs (one run's own
        figures when it has one), and the impact figures."""
        if len(self.summaries) == 1:
            return {**figures(self.summaries[0]), **self.impact}
        return {**{n: e.value for n, e in self.estimates.items()}, **self.impact}

    @property
    def status(self) -> str:
        """``complete`` when every run of the arm completed, else the first other status."""
        return next((s.status for s in self.summaries if s.status != "complete"), "complete")

    def as_figures(self) -> ArmFigures:
        """The arm as the comparison takes it (cuts by reason: the mean over its runs)."""
        reasons: dict[str, float] = {}
        for s in self.summaries:
            for key, value in (s.proxy.cut_reasons if s.proxy else {}).items():
                reasons[key] = reasons.get(key, 0.0) + value / len(self.summaries)
        first = self.summaries[0] if self.summaries else None
        return ArmFigures(
            figures=self.figures,
            groups=[g.group for g in first.groups] if first else [],
            status=self.status,
            saturated=any(s.client_saturation.saturated for s in self.summaries),
            proxy_kind=self.arm.proxy.kind,
            cut_reasons=reasons,
            repeats=len(self.runs),
            intervals={
                n: (e.low, e.high)
                for n, e in self.estimates.items()
                if e.low is not None and e.high is not None
            },
        )


def arm_folder(folder: Path, arm: Arm) -> Path:
    """Where ``arm``'s aggregate goes, under the plan's ``folder``."""
    return folder / arm.folder if arm.folder else folder


def arm_aggregate(folder: Path, record: PlanRecord, arm: Arm) -> ArmAggregate:
    """The aggregate of ``arm`` from the run folders of the plan in ``folder`` (module
    docstring). Raises :class:`~zwcore.RunFolderError` for a run whose summary is missing or
    invalid."""
    plan = record.plan
    runs = [folder / e.path for e in record.of_arm(arm)]
    controls = [folder / e.path for e in record.of_arm(arm, "control")]
    evidence = evidence_of(runs)
    names = sorted({name for f in evidence.figures for name in f})
    estimates = {
        n: estimate(evidence, n, confidence=plan.confidence, n=plan.bootstrap_draws) for n in names
    }
    impacts: dict[str, float | None] = {}
    if controls:
        victims = [g.name for g in plan.scenario.groups if not g.aggressor]
        impacts = impact(
            evidence, evidence_of(controls), victims,
            confidence=plan.confidence, n=plan.bootstrap_draws,
        )  # fmt: skip
    summaries = [read_summary(r) for r in runs]
    return ArmAggregate(
        arm, arm_folder(folder, arm), runs, controls, summaries, evidence, estimates, impacts
    )


def healthy_groups(plan: Plan) -> list[str]:
    """Groups of healthy readers: full-speed reads, no client action (stalls, closes)."""
    groups = plan.scenario.groups
    return [g.name for g in groups if isinstance(g.read, FullSpeed) and g.action is None]


def comparison_of(plan: Plan, arms: Mapping[str, ArmAggregate]) -> Comparison:
    """The configurations of a comparison side by side (``harness.analysis._comparison``),
    each from its figures over its runs."""
    return compare(
        {name: a.as_figures() for name, a in arms.items()},
        kinds={a.arm.name: a.arm.proxy.kind for a in arms.values()},
        healthy_groups=healthy_groups(plan),
    )


def swept_groups(plan: Plan) -> list[str]:
    """The groups a sweep varies: open-loop with a rate."""
    return [g.name for g in plan.scenario.groups if isinstance(g.arrival, RateArrivals)]


def sweep_of(folder: Path, record: PlanRecord) -> SweepTable:
    """The table of the sweep in ``folder`` (``harness.analysis._sweep``)."""
    settings = record.plan.options.sweep
    goodput = settings.goodput_slo_ms if settings is not None else {}
    groups = swept_groups(record.plan)
    points = [sweep_point(folder / e.path, e, groups, goodput) for e in record.runs]
    return sweep_table(points, goodput)


def run_folders(folder: Path) -> list[Path]:
    """The run folders a folder's figures stand for: the repeats of a run with repeats (its
    ``repeats.json``; a configuration of a comparison), in order, or the folder itself.
    Raises :class:`~zwcore.RunFolderError` for a ``repeats.json`` that cannot be read, and for
    a comparison's folder (it holds several configurations: name one)."""
    if is_plan_folder(folder) and read_plan(folder).plan.kind == "comparison":
        names = ", ".join(str(folder / a.folder) for a in read_plan(folder).plan.arms)
        raise RunFolderError(
            f"{folder}: a comparison of several configurations; name one of {names}"
        )
    if not (folder / REPEATS_JSON).exists():
        return [folder]
    try:
        names = read_json(folder / REPEATS_JSON)["runs"]
        return [folder / str(n) for n in names]
    except (KeyError, TypeError) as exc:
        raise RunFolderError(f"{folder / REPEATS_JSON}: not a repeats record: {exc}") from None


def uncertainty_of(run_dir: Path) -> tuple[float, int]:
    """The interval setting (confidence, bootstrap draws) a folder recorded: its plan's or its
    repeats', else its run's scenario's ``[gating]``, else the defaults (0.95, 1,000)."""
    places = ((PLAN_JSON, ("plan",)), (REPEATS_JSON, ()), (RUN_JSON, ("scenario", "gating")))
    for name, keys in places:
        path = run_dir / name
        if not path.is_file():
            continue
        node: Any = read_json(path)
        for key in keys:
            node = node.get(key) or {} if isinstance(node, dict) else {}
        if isinstance(node, dict) and "confidence" in node:
            return float(node["confidence"]), int(node["bootstrap_draws"])
    return 0.95, 1000
