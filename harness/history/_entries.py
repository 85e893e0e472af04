"""History entries: what the store keeps of a run folder or a plan's folder.

An :class:`Entry` is one measurement of one configuration of one scenario: a run (its figures
as measured), or one configuration (arm) of a plan over its repeats (each figure's estimate
with its interval). Its **series** is what makes measurements comparable: the scenario, the
configuration, the target's kind, engine version and model, the machine (CPU model and count,
memory in GiB) and the accelerator. Runs that differ in any of these are series of their own;
the toolkit's own version, the commit under test and the host name are provenance, not series
(a CI runner's host name changes every job).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.analysis import PlanRecord, is_plan_folder, read_plan
from harness.runfolder import (
    GATES_JSON,
    REPEATS_JSON,
    RUN_JSON,
    SUITE_JSON,
    RunSummary,
    figures,
    read_json,
)
from harness.scenario import Arm
from zwcore import RunFolderError

# Versions of the toolkit's own stack (harness.lifecycle._runinfo.versions): provenance only.
_OWN_VERSIONS = ("zerowindow", "locust", "python", "kernel")
_GiB = 1 << 30


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def series_key(scenario: dict[str, Any], arm: str, info: dict[str, Any]) -> dict[str, Any]:
    """The facts that make two entries comparable (module docstring), from the scenario as
    run (``run.json``'s or ``plan.json``'s ``scenario``), the configuration's name ``arm`` and
    the rest of ``run.json``/``plan.json`` (``info``: versions, host, accelerator)."""
    target = scenario.get("target", {})
    host = info.get("host", {})
    memory = host.get("memory_bytes")
    accelerator = info.get("accelerator") or {}
    return {
        "scenario": scenario.get("name"),
        "arm": arm,
        "target_kind": target.get("kind"),
        "engine": {
            k: v for k, v in sorted(info.get("versions", {}).items()) if k not in _OWN_VERSIONS
        },  # fmt: skip
        "model": target.get("model") or target.get("served_model_name"),
        "machine": {
            "cpu_model": host.get("cpu_model"),
            "cpus": host.get("cpus"),
            "memory_gib": round(memory / _GiB) if memory else None,
        },
        "accelerator": [g.get("name") for g in accelerator.get("gpus", [])] or None,
    }


def series_of(scenario: dict[str, Any], arm: str, info: dict[str, Any]) -> str:
    """The series id (a short hash) of :func:`series_key`."""
    return _digest(series_key(scenario, arm, info))


def entry_id(kind: str, scenario: str, arm: str, info: dict[str, Any]) -> str:
    """The id of an entry: the same run (or plan) always gives the same id, wherever its
    folder was copied to."""
    harness = info.get("harness", {})
    host = info.get("host", {}).get("hostname")
    return _digest([kind, scenario, arm, info.get("started_utc"), host, harness.get("pid")])


@dataclass
class Entry:
    """One measurement of one configuration of a scenario (module docstring).

    ``figures``: name -> ``(value, low, high)`` (``low``/``high`` are ``None`` for a single
    run); ``gates``: ``(gate, figure, verdict, passed, measured, bound, reason)`` each;
    ``provenance``: versions, target, host, accelerator and CI facts as recorded."""

    entry_id: str
    kind: str  # "run" or "plan"
    scenario: str
    arm: str
    series_key: dict[str, Any]
    scenario_hash: str
    started_utc: str
    status: str
    exit_code: int | None
    repeats: int
    folder: str
    provenance: dict[str, Any]
    verdicts: dict[str, Any] = field(default_factory=dict)
    figures: dict[str, tuple[float | None, float | None, float | None]] = field(
        default_factory=dict
    )
    gates: list[tuple[Any, ...]] = field(default_factory=list)

    @property
    def series(self) -> str:
        return _digest(self.series_key)

    def row(self) -> dict[str, Any]:
        """The entry as a row of ``zw_entries``."""
        ci = self.provenance.get("ci", {})
        return {
            "entry_id": self.entry_id, "kind": self.kind, "scenario": self.scenario,
            "arm": self.arm, "series": self.series, "series_key": json.dumps(self.series_key),
            "scenario_hash": self.scenario_hash,
            "started_utc": datetime.fromisoformat(self.started_utc),
            "added_utc": datetime.now(UTC), "status": self.status,
            "exit_code": self.exit_code, "repeats": self.repeats, "folder": self.folder,
            "commit_sha": ci.get("commit"), "ci_run_id": ci.get("run_id"),
            "provenance": json.dumps(self.provenance, default=str),
            "verdicts": json.dumps(self.verdicts, default=str),
        }  # fmt: skip


def _provenance(scenario: dict[str, Any], info: dict[str, Any]) -> dict[str, Any]:
    target = dict(scenario.get("target", {}))
    host = {k: v for k, v in info.get("host", {}).items() if k != "python_executable"}
    return {
        "versions": info.get("versions", {}),
        "target": target,
        "host": host,
        "accelerator": info.get("accelerator"),
        "ci": info.get("ci", {}),
        "engine_probe": info.get("engine_probe"),
    }


def _gate_rows(gates: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    keys = ("gate", "figure", "verdict", "passed", "measured", "bound", "reason")
    return [tuple(g.get(k) for k in keys) for g in gates]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def run_entry(folder: Path, *, kind: str = "run", plan_info: dict[str, Any] | None = None,
              arm: str | None = None) -> Entry:  # fmt: skip
    """The entry of a run folder (``run.json``, ``summary.json``, ``gates.json``). Raises
    :class:`~zwcore.RunFolderError` for a folder whose run never ended (``running``) or whose
    files cannot be read."""
    info = read_json(folder / RUN_JSON)
    if info.get("status") == "running":
        raise RunFolderError(
            f"{folder}: the run has not ended (run.json says running): `zerowindow analyze "
            f"{folder}` ends a killed run's folder"
        )
    summary_path = folder / "summary.json"
    try:
        summary = RunSummary.model_validate_json(summary_path.read_bytes())
    except (OSError, ValidationError) as exc:
        raise RunFolderError(f"{summary_path}: cannot read the run's summary: {exc}") from None
    scenario = info.get("scenario", {})
    name = str(scenario.get("name"))
    arm = arm or str(info.get("proxy_name") or scenario.get("proxy", {}).get("kind", "none"))
    source = plan_info or info
    gates = (
        read_json(folder / GATES_JSON).get("gates", []) if (folder / GATES_JSON).is_file() else []
    )
    return Entry(
        entry_id=entry_id(kind, name, arm, source),
        kind=kind, scenario=name, arm=arm, series_key=series_key(scenario, arm, info),
        scenario_hash=_digest(scenario), started_utc=str(source.get("started_utc")),
        status=summary.status, exit_code=source.get("exit_code"), repeats=1,
        folder=str(folder.resolve()), provenance=_provenance(scenario, info),
        verdicts=summary.verdicts,
        figures={n: (v, None, None) for n, v in figures(summary).items()},
        gates=_gate_rows(gates),
    )  # fmt: skip


def plan_entries(folder: Path) -> list[Entry]:
    """The entries of a plan's folder: one per configuration (arm) that ran, over its repeats
    (``repeats.json``: each figure's estimate and interval); an arm of one run is that run.
    A sweep's steps are runs at different loads, not repeats of one: each step is an entry of
    its own, its configuration named ``<arm>@<step folder>``. Raises
    :class:`~zwcore.RunFolderError` as :func:`run_entry` does."""
    record = read_plan(folder)
    plan, info = record.plan, record.info
    if info.get("status") == "running":
        raise RunFolderError(
            f"{folder}: the plan has not ended (plan.json says running): `zerowindow analyze "
            f"{folder}` ends a killed plan's folder"
        )
    scenario = plan.scenario.model_dump(mode="json")
    entries: list[Entry] = []
    for arm in plan.arms:
        if plan.kind == "sweep":
            for step in record.of_arm(arm, "step"):
                run = run_entry(folder / step.path, kind="run", arm=f"{arm.name}@{step.path}")
                entries.append(run)
            continue
        runs = record.of_arm(arm)
        if not runs:
            continue
        arm_folder = folder / arm.folder
        if not (arm_folder / REPEATS_JSON).is_file():  # an arm of one run, gated as a run
            entries.append(run_entry(folder / runs[0].path, kind="plan", plan_info=info,
                                     arm=arm.name))  # fmt: skip
            continue
        repeats = read_json(arm_folder / REPEATS_JSON)
        estimates = repeats.get("figures", {})
        merged = arm_info(folder, record, arm)
        entries.append(Entry(
            entry_id=entry_id("plan", plan.scenario.name, arm.name, info),
            kind="plan", scenario=plan.scenario.name, arm=arm.name,
            series_key=series_key(scenario, arm.name, merged), scenario_hash=_digest(scenario),
            started_utc=str(info.get("started_utc")), status=str(info.get("status")),
            exit_code=info.get("exit_code"), repeats=len(repeats.get("runs", [])),
            folder=str(arm_folder.resolve()), provenance=_provenance(scenario, merged),
            figures={n: (_number(e.get("value")), _number(e.get("low")), _number(e.get("high")))
                     for n, e in estimates.items()},
            gates=_gate_rows(repeats.get("gates", [])),
        ))  # fmt: skip
    return entries


def arm_info(folder: Path, record: PlanRecord, arm: Arm) -> dict[str, Any]:
    """The facts of a plan's configuration ``arm`` for its series and provenance: the plan's
    ``plan.json`` over its first run's ``run.json`` (which adds what only a run records)."""
    runs = record.of_arm(arm)
    first = read_json(folder / runs[0].path / RUN_JSON) if runs else {}
    return {**first, **{k: v for k, v in record.info.items() if v is not None}}


def folder_entries(folder: Path, skipped: list[str] | None = None) -> list[Entry]:
    """The entries of any folder the toolkit wrote: a run's, a plan's, a suite's (each
    incident's), or a folder holding such folders (searched below it: ``results/``). Below a
    folder that is none of these, a folder that cannot be read is named in ``skipped`` (one
    line each) when a list is given, else raised. Raises :class:`~zwcore.RunFolderError`
    for a folder with no run in it, or one that cannot be read."""
    if not folder.is_dir():
        raise RunFolderError(f"{folder}: no such folder")
    if is_plan_folder(folder):
        return plan_entries(folder)
    if (folder / RUN_JSON).is_file():
        return [run_entry(folder)]
    found: list[Entry] = []
    for child in sorted(p for p in folder.iterdir() if p.is_dir()):
        if not _holds_runs(child):
            continue
        try:
            found += folder_entries(child, skipped)
        except RunFolderError as exc:
            if skipped is None or (folder / SUITE_JSON).is_file():
                raise
            skipped.append(str(exc))
    if not found and not skipped:
        raise RunFolderError(
            f"{folder}: no run, plan or suite folder in it (none has run.json or plan.json)"
        )
    return found


def _holds_runs(folder: Path) -> bool:
    """Whether a run's or a plan's folder is at or below ``folder``."""
    return any(True for _ in folder.rglob(RUN_JSON))
