"""``zerowindow suite run DIR``: the incident catalogue against one stack, a list of plans.

Every ``*.toml`` in ``DIR`` with an ``[incident]`` table is an incident; all are read,
validated and made into plans (``harness.scenario.make_plan``: an incident's ``repeats``,
``control``, rerun policy and ``proxies`` are honoured) before anything starts (an invalid one
raises :class:`~zwcore.ScenarioError` naming its file and line). Each plan then runs into
``out_root/suite/<UTC timestamp>/<incident>/<stamp>/`` against:

- ``target="scenario"``: each incident's own ``[target]``;
- ``target=KIND``, a target kind that can stand in for an incident's target
  (:meth:`~harness.servers.TargetConfigBase.for_suite`: ``sim``, ``vllm``): the incident's own
  target when it is of that kind, else the kind's suite target (``vllm``: a real vLLM serving
  ``model``, started for each incident, about 50 s each on this project's 2-CPU machine);
- ``target_url``: a server that is already running (a ``url`` target; ``engine_dir`` names
  the folder where its engine probe writes, as for ``[target] engine_dir``), serving
  ``served_model_name`` (default: the first model its ``/v1/models`` lists).

``suite.json`` lists the incidents and their folders. A suite outcome per incident says
whether the stack failed it (a gate failed, or a run did not complete) and what its findings
measured (``[incident] findings``: evaluated, never failed on); a matrix incident has one
outcome per cell as well (the gates that name the cell's group). The cases are a pure
function of the incidents' folders: ``zerowindow analyze`` on the suite's folder recomputes
them and ``junit.xml``.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from harness.gates import GateResult, evaluate_gates
from harness.lifecycle._exit import EXIT_INTERRUPTED, decide
from harness.lifecycle._inputs import baseline_for
from harness.lifecycle._plan_run import run_plan
from harness.lifecycle._results import PlanResult
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.outputs import (
    CaseOutcome,
    SuiteResult,
    abort_text,
    case_record,
    ratio_text,
    report_or_warning,
    wasted_text,
    write_suite_junit,
)
from harness.runfolder import SUITE_JSON, MatrixCell, read_json, write_json
from harness.scenario import Plan, RunOptions, Scenario, load_scenario, make_plan
from harness.servers import TARGETS, TargetConfigBase, UrlTargetConfig
from zwcore import RunFolderError, ScenarioError

SCENARIO_TARGET = "scenario"


def suite_targets() -> list[str]:
    """What ``--target`` takes: ``scenario`` and every target kind that can stand in for an
    incident's target."""
    kinds = [k for k in TARGETS.kinds() if TARGETS.get(k).for_suite(model=None) is not None]
    return [SCENARIO_TARGET, *kinds]


def load_incidents(directory: Path, only: list[str] | None = None) -> list[tuple[Path, Scenario]]:
    """The incidents in ``directory`` (sorted by file name), those named in ``only`` if given.
    Raises :class:`ScenarioError` for an invalid file, a folder without incidents, or a name
    in ``only`` that is not an incident there (the error lists the valid names)."""
    if not directory.is_dir():
        raise ScenarioError(f"{directory}: not a folder of incident scenarios")
    found = [(p, load_scenario(p)) for p in sorted(directory.glob("*.toml"))]
    incidents = [(p, s) for p, s in found if s.incident is not None]
    if not incidents:
        raise ScenarioError(f"{directory}: no scenario there has an [incident] table")
    if only:
        names = {s.name for _, s in incidents}
        unknown = [n for n in only if n not in names]
        if unknown:
            raise ScenarioError(
                f"--only {', '.join(unknown)}: no such incident in {directory} "
                f"(incidents: {', '.join(sorted(names))})"
            )
        incidents = [(p, s) for p, s in incidents if s.name in only]
    return incidents


def served_model(target_url: str) -> str:
    """The first model ``GET {target_url}/v1/models`` lists (OpenAI's model list). Raises
    :class:`ScenarioError` when the server does not answer with one."""
    try:
        response = httpx.get(f"{target_url.rstrip('/')}/v1/models", timeout=10.0)
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])
    except httpx.TransportError as exc:
        raise ScenarioError(f"--target-url {target_url}: no server answers there ({exc})") from None
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise ScenarioError(
            f"--target-url {target_url}: cannot read its model from /v1/models ({exc}); "
            "give --served-model-name"
        ) from None


def retarget(
    scenario: Scenario,
    target: str,
    *,
    target_url: str | None = None,
    engine_dir: Path | None = None,
    model: str | None = None,
    served_model_name: str | None = None,
) -> Scenario:
    """``scenario`` with the suite's target in place of its own (see the module docstring);
    ``served_model_name`` is the name a ``target_url`` serves (default: the scenario's).
    Raises :class:`ScenarioError` for a ``target`` that is not one of :func:`suite_targets`."""
    new: TargetConfigBase | None
    if target_url is not None:
        new = UrlTargetConfig(
            kind="url",
            url=target_url,
            served_model_name=served_model_name or scenario.target.served_model_name,
            engine_dir=None if engine_dir is None else str(engine_dir),
        )
    elif target == SCENARIO_TARGET or (scenario.target.kind == target and model is None):
        return scenario  # (with --model, an incident of that kind serves that model too)
    else:
        valid = suite_targets()
        new = TARGETS.get(target).for_suite(model=model) if target in TARGETS.kinds() else None
        if new is None:
            raise ScenarioError(f"--target {target!r}: expected one of {', '.join(valid)}")
    return scenario.model_copy(update={"target": new})


def _gate_failures(gates: list[GateResult], prefix: str = "") -> list[str]:
    return [f"{prefix}{g.gate}: {g.reason}" for g in gates if not g.passed]


def _cell_line(c: MatrixCell) -> str:
    """One run's line of a cell; a cell none of whose clients left in its phase says so first,
    with where they were instead (``harness.outputs.abort_text``)."""
    victims = f"victims' TTFT p99 x control {ratio_text(c)}"
    if c.exercised is False:
        return f"{c.cell}: {abort_text(c)}: its gates are inconclusive; {victims}"
    return (
        f"{c.cell}: phases {c.phases or '-'}; leave->abort ms p50 / max {abort_text(c)}; "
        f"tokens after leaving {wasted_text(c)}; {victims}"
    )


def _matrix_cases(scenario: Scenario, result: PlanResult) -> list[CaseOutcome]:
    """One case per cell: the gates that name the cell's group (per configuration: those that
    failed fail it, those inconclusive that passed by the scenario's policy are listed), and
    each run's line of the cell."""
    cases: dict[str, CaseOutcome] = {}
    for label, arm in result.arms.items():
        prefix = f"{label}: " if len(result.arms) > 1 else ""
        for i, run in enumerate(arm.runs):
            where = f"{prefix}{run.run_dir.name}: " if len(arm.runs) > 1 else prefix
            for cell in run.summary.matrix:
                if cell.phase == "control":
                    continue
                name = f"{scenario.name}[{cell.cell}]"
                case = cases.setdefault(name, CaseOutcome(name, scenario.name))
                if i == 0:
                    theirs = [g for g in arm.gates if g.figure.startswith(f"{cell.cell}.")]
                    case.failures += _gate_failures(theirs, prefix)
                    case.details += [f"{prefix}{g.gate}: {g.reason}"
                                     for g in theirs if g.inconclusive and g.passed]  # fmt: skip
                case.details.append(where + _cell_line(cell))
    return list(cases.values())


def incident_cases(
    scenario: Scenario, result: PlanResult | None, failure: str | None
) -> list[CaseOutcome]:
    """The cases of one incident (module docstring) from its plan's result (``None``: it did
    not run, ``failure`` says why)."""
    assert scenario.incident is not None
    case = CaseOutcome(scenario.name, scenario.name)
    case.details.append(f"source: {scenario.incident.source}")
    if result is None:
        case.error = failure or "nothing ran"
        return [case]
    many = len(result.arms) > 1
    cells = {f"{c.cell}." for r in result.runs.values() for c in r.summary.matrix}
    for label, arm in result.arms.items():
        prefix = f"{label}: " if many else ""
        broken = [r for r in arm.runs if r.summary.status != "complete"]
        for run in broken:
            case.error = f"{prefix}run {run.summary.status}: {run.summary.failure}"
        own = [g for g in arm.gates if not any(g.figure.startswith(p) for p in cells)]
        case.failures += _gate_failures(own, prefix)
        if arm.runs and not broken:  # an incomplete run's figures are not findings
            found = evaluate_gates(scenario.incident.findings, arm.figures)
            case.findings += [(label if many else "", g) for g in found]
        else:
            case.details.append(f"{prefix}findings not evaluated: a run did not complete")
        case.details.append(f"{prefix}folder {arm.run_dir}")
        case.duration_s += sum(r.summary.duration_s for r in arm.runs)
    if result.failure and case.error is None and not case.failures and result.exit_code:
        case.error = result.failure
    if not result.runs:
        case.error = result.failure or "nothing ran"
    return [case, *(_matrix_cases(scenario, result) if scenario.matrix else [])]


def _record(folder: Path, entries: list[dict[str, Any]], **extra: Any) -> None:
    write_json(folder / SUITE_JSON, {**extra, "incidents": entries})


def plan_suite(
    directory: Path,
    *,
    target: str = SCENARIO_TARGET,
    target_url: str | None = None,
    engine_dir: Path | None = None,
    only: list[str] | None = None,
    model: str | None = None,
    served_model_name: str | None = None,
    options: RunOptions | None = None,
) -> list[tuple[Path, Plan]]:
    """The plan of each incident of ``directory`` against the suite's target (module
    docstring), with ``options``. Raises :class:`ScenarioError` for an invalid incident, a
    pair of options an incident's plan refuses, a baseline an incident's relative gates need
    that cannot be loaded, an unknown ``target``, or a ``target_url`` whose model cannot be
    read."""
    incidents = load_incidents(directory, only)
    if target_url is not None and served_model_name is None:
        served_model_name = served_model(target_url)
    plans: list[tuple[Path, Plan]] = []
    for path, scenario in incidents:
        scenario = retarget(
            scenario, target, target_url=target_url, engine_dir=engine_dir, model=model,
            served_model_name=served_model_name,
        )  # fmt: skip
        plan = make_plan(scenario, options, scenario_path=path)
        try:  # a baseline the incident's relative gates need stops the suite now, not later
            baseline_for(plan.scenario, plan.options.baseline, use=plan.options.use_baseline)
        except RunFolderError as exc:
            raise ScenarioError(f"incident {scenario.name!r} ({path}): {exc}") from None
        plans.append((path, plan))
    return plans


def run_suite(
    directory: Path,
    *,
    target: str = SCENARIO_TARGET,
    out_root: Path = Path("results"),
    **planning: Any,
) -> SuiteResult:
    """Run the incidents of ``directory`` (see the module docstring) one after another, each
    as its plan (:func:`plan_suite`, which takes ``planning``); never raises for a failed run
    (its case says why). Raises what :func:`plan_suite` raises, before anything starts."""
    plans = plan_suite(directory, target=target, **planning)
    target_url = planning.get("target_url")
    root = out_root
    folder = out_root / "suite" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    result, entries = SuiteResult(folder), list[dict[str, Any]]()
    facts = {"directory": str(directory), "target": target, "target_url": target_url}
    _record(folder, entries, **facts, status="running")
    with signals_raise():
        try:
            for path, plan in plans:
                done, failure = _run_incident(plan, folder, root)
                entries.append(_entry(plan, path, folder, done, failure))
                _record(folder, entries, **facts, status="running")
                result.cases += incident_cases(plan.scenario, done, failure)
                if done is not None and done.exit_code == EXIT_INTERRUPTED:
                    raise RunInterrupted("signal")
        except RunInterrupted:  # during an incident, or between two
            ran = {c.incident for c in result.cases}
            result.cases += [
                CaseOutcome(p.scenario.name, p.scenario.name,
                            skipped="not run: the suite was interrupted")
                for _, p in plans if p.scenario.name not in ran
            ]  # fmt: skip
            result.exit_code = decide([], interrupted=True)
    if not result.exit_code:
        result.exit_code = decide(["complete" if c.passed else "failed" for c in result.cases])
    _end(result, {**facts, "incidents": entries, "status": "ended"})
    return result


def _run_incident(
    plan: Plan, folder: Path, history_root: Path
) -> tuple[PlanResult | None, str | None]:
    try:
        return run_plan(plan, out_root=folder, history_root=history_root), None
    except ScenarioError as exc:  # this stack cannot run it (a namespace, a baseline...)
        return None, f"cannot run against this target: {exc}"


def _end(result: SuiteResult, record: dict[str, Any]) -> None:
    """The suite's end: its cases and exit code in ``suite.json``, ``junit.xml``, the report."""
    record = {**record, "exit_code": result.exit_code}
    cases = [case_record(c) for c in result.cases]
    write_json(result.run_dir / SUITE_JSON, {**record, "cases": cases})
    write_suite_junit(result)
    if warning := report_or_warning(result.run_dir):
        print(warning, file=sys.stderr)


def _entry(
    plan: Plan, path: Path, folder: Path, done: PlanResult | None, failure: str | None
) -> dict[str, Any]:
    """The incident in ``suite.json``: where its plan's folder is (the scenario itself when
    it did not run), and why it did not run."""
    entry: dict[str, Any] = {"name": plan.scenario.name, "scenario_path": str(path)}
    if done is not None:
        entry["folder"] = str(done.run_dir.relative_to(folder))
    else:
        entry.update(failure=failure, scenario=plan.scenario.model_dump(mode="json"))
    return entry


def reanalyze_suite(
    folder: Path, *, baseline: Any = None, use_baseline: bool = True
) -> SuiteResult:
    """The suite in ``folder`` analysed again: each incident's folder, then the cases and
    ``junit.xml`` (module docstring). Raises :class:`~zwcore.RunFolderError` for a
    ``suite.json`` that cannot be read."""
    from harness.lifecycle._analyze_folder import reanalyze

    record = read_json(folder / SUITE_JSON)
    result = SuiteResult(folder)
    try:
        entries = list(record["incidents"])
        for entry in entries:
            if entry.get("folder"):
                found = reanalyze(folder / entry["folder"], baseline=baseline,
                                  use_baseline=use_baseline)  # fmt: skip
                assert isinstance(found, PlanResult)
                result.cases += incident_cases(found.plan.scenario, found, None)
            else:
                scenario = Scenario.model_validate(entry["scenario"])
                result.cases += incident_cases(scenario, None, entry.get("failure"))
    except (KeyError, TypeError, ValueError) as exc:
        raise RunFolderError(f"{folder / SUITE_JSON}: not a suite record ({exc})") from None
    interrupted = record.get("exit_code") == EXIT_INTERRUPTED
    result.exit_code = decide(
        ["complete" if c.passed else "failed" for c in result.cases], interrupted=interrupted
    )
    _end(result, record)
    return result
