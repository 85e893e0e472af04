"""``zerowindow suite run DIR``: the incident catalogue against one stack.

Every ``*.toml`` in ``DIR`` with an ``[incident]`` table is an incident; all are read and
validated before anything starts (an invalid one raises :class:`~zwcore.ScenarioError`
naming its file and line). Each then runs as ``zerowindow run`` would (a scenario with
``proxies`` as a comparison), under ``out_root/suite/<UTC timestamp>/``, against:

- ``target="scenario"``: each incident's own ``[target]``;
- ``target="sim"``: the engine emulator (the incident's own engine settings when its target
  is ``sim``, else the emulator's defaults);
- ``target="vllm"``: a real vLLM serving ``model`` with :data:`VLLM_ARGS` (the engine probe
  on), started for each incident (about 50 s each on this project's 2-CPU machine);
- ``target_url``: a server that is already running (a ``url`` target; ``engine_dir`` names
  the folder where its engine probe writes, as for ``[target] engine_dir``), serving
  ``served_model_name`` (default: the first model its ``/v1/models`` lists).

A suite outcome per incident says whether the stack failed it (a gate of the scenario
failed, or the run did not complete) and what its findings measured (``[incident]
findings``: evaluated, never failed on); a matrix incident has one outcome per cell as
well (the gates that name the cell's group).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import httpx

from harness.gates import GateResult, evaluate_gates
from harness.lifecycle._comparison_run import run_comparison
from harness.lifecycle._conclude import EXIT_FAILED, EXIT_INTERRUPTED, RunResult
from harness.lifecycle._run import run_scenario
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.outputs import CaseOutcome, SuiteResult
from harness.outputs._matrix import abort_text, ratio_text, wasted_text
from harness.runfolder import MatrixCell, figures
from harness.scenario import Scenario, load_scenario
from harness.servers import SimTargetConfig, TargetConfigBase, UrlTargetConfig, VllmTargetConfig
from zwcore import ScenarioError

SuiteTarget = Literal["scenario", "sim", "vllm"]
VLLM_ARGS = [
    "--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16",
    "--max-model-len", "2048", "--gpu-memory-utilization", "0.1",
]  # fmt: skip
"""The vLLM of ``target="vllm"``: 64 KV blocks of 32 tokens (DESIGN.md's measurement), 16
sequences at most, prompts of up to 2,048 tokens with their output."""


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
    target: SuiteTarget,
    *,
    target_url: str | None = None,
    engine_dir: Path | None = None,
    model: str = "models/tiny",
    served_model_name: str | None = None,
) -> Scenario:
    """``scenario`` with the suite's target in place of its own (see the module docstring);
    ``served_model_name`` is the name a ``target_url`` serves (default: the scenario's)."""
    new: TargetConfigBase
    if target_url is not None:
        new = UrlTargetConfig(
            kind="url",
            url=target_url,
            served_model_name=served_model_name or scenario.target.served_model_name,
            engine_dir=None if engine_dir is None else str(engine_dir),
        )
    elif target == "sim":
        own = scenario.target
        new = own if isinstance(own, SimTargetConfig) else SimTargetConfig()
    elif target == "vllm":
        new = VllmTargetConfig(kind="vllm", model=model, served_model_name="tiny",
                               extra_args=VLLM_ARGS)  # fmt: skip
    else:
        return scenario
    return scenario.model_copy(update={"target": new})


def _gate_failures(gates: list[GateResult], prefix: str = "") -> list[str]:
    return [f"{prefix}{g.gate}: {g.reason}" for g in gates if not g.passed]


def _matrix_cases(name: str, run: RunResult) -> list[CaseOutcome]:
    cases = []
    for cell in run.summary.matrix:
        if cell.phase == "control":
            continue
        theirs = [g for g in run.gates if g.figure.startswith(f"{cell.cell}.")]
        case = CaseOutcome(f"{name}[{cell.cell}]", name, failures=_gate_failures(theirs))
        case.details.append(_cell_line(cell))
        cases.append(case)
    return cases


def _cell_line(c: MatrixCell) -> str:
    return (
        f"{c.cell}: phases {c.phases or '-'}; leave->abort ms p50 / max {abort_text(c)}; "
        f"tokens after leaving {wasted_text(c)}; victims' TTFT p99 x control {ratio_text(c)}"
    )


def _incident_case(
    scenario: Scenario, runs: dict[str, RunResult], failure: str | None
) -> CaseOutcome:
    assert scenario.incident is not None
    case = CaseOutcome(scenario.name, scenario.name)
    case.details.append(f"source: {scenario.incident.source}")
    for label, run in runs.items():
        prefix = f"{label}: " if len(runs) > 1 else ""
        if run.summary.status != "complete":
            case.error = f"{prefix}run {run.summary.status}: {run.summary.failure}"
        cell_gates = {f"{c.cell}." for c in run.summary.matrix}
        own = [g for g in run.gates if not any(g.figure.startswith(p) for p in cell_gates)]
        case.failures += _gate_failures(own, prefix)
        if run.summary.status == "complete":  # an incomplete run's figures are not findings
            found = evaluate_gates(scenario.incident.findings, figures(run.summary))
            case.findings += [(label if len(runs) > 1 else "", g) for g in found]
        else:
            case.details.append(f"{prefix}findings not evaluated: the run did not complete")
        case.details.append(f"{prefix}run folder {run.run_dir}")
        case.duration_s += run.summary.duration_s
    if failure and case.error is None and not case.failures:
        case.error = failure
    if not runs:
        case.error = failure or "nothing ran"
    return case


def _run_incident(path: Path, scenario: Scenario, out: Path, result: SuiteResult) -> bool:
    """Run one incident into ``out`` and add its cases to ``result``; ``False`` when the run
    was interrupted."""
    runs: dict[str, RunResult] = {}
    try:
        if scenario.proxies:
            comparison = run_comparison(scenario, scenario_path=path, out_root=out)
            runs, failure, code = comparison.runs, comparison.failure, comparison.exit_code
        else:
            run = run_scenario(scenario, scenario_path=path, out_root=out)
            runs, failure, code = {scenario.name: run}, None, run.exit_code
    except ScenarioError as exc:  # this stack cannot run it (a namespace, a baseline...)
        failure, code = f"cannot run against this target: {exc}", EXIT_FAILED
    result.cases.append(_incident_case(scenario, runs, failure))
    if scenario.matrix is not None:
        for run in runs.values():
            result.cases += _matrix_cases(scenario.name, run)
    return code != EXIT_INTERRUPTED


def run_suite(
    directory: Path,
    *,
    target: SuiteTarget = "scenario",
    target_url: str | None = None,
    engine_dir: Path | None = None,
    only: list[str] | None = None,
    out_root: Path = Path("results"),
    model: str = "models/tiny",
    served_model_name: str | None = None,
) -> SuiteResult:
    """Run the incidents of ``directory`` (see the module docstring) one after another; never
    raises for a failed run (its case says why). Raises :class:`ScenarioError` before anything
    starts (see :func:`load_incidents`)."""
    incidents = load_incidents(directory, only)
    if target_url is not None and served_model_name is None:
        served_model_name = served_model(target_url)
    incidents = [
        (p, retarget(s, target, target_url=target_url, engine_dir=engine_dir, model=model,
                     served_model_name=served_model_name))
        for p, s in incidents
    ]  # fmt: skip
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = out_root / "suite" / stamp
    out.mkdir(parents=True, exist_ok=True)
    result = SuiteResult(out)
    with signals_raise():
        try:
            for path, scenario in incidents:
                if not _run_incident(path, scenario, out, result):
                    raise RunInterrupted("signal")
        except RunInterrupted:  # during an incident, or between two
            result.exit_code = EXIT_INTERRUPTED
            ran = {c.incident for c in result.cases}
            result.cases += [
                CaseOutcome(s.name, s.name, skipped="not run: the suite was interrupted")
                for _, s in incidents
                if s.name not in ran
            ]
            return result
    if any(not c.passed for c in result.cases):
        result.exit_code = EXIT_FAILED
    return result
