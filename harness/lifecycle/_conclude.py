"""The end of every run, and ``zerowindow analyze RUN_DIR``: analysis → gates → outputs.

:func:`conclude` takes a run folder and its life cycle's :class:`~harness.analysis.RunFacts`,
analyses it, evaluates the gates, takes the exit code from the one policy
(``harness.lifecycle._exit``), and writes ``summary.json``, ``gates.json``, ``junit.xml``, the
end of ``run.json`` and the report. Each stage takes what the one before produced and writes
nothing back.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.analysis import (
    Evidence,
    RunFacts,
    analyze,
    read_facts,
    run_samples,
    write_analysis,
)
from harness.gates import (
    Baseline,
    baseline_path,
    evaluate_gates,
    load_baseline,
)
from harness.history import run_past
from harness.lifecycle._exit import EXIT_SETUP, exit_code
from harness.lifecycle._results import RunResult
from harness.outputs import Concluded, junit_run, send_traces, traces_endpoint, write_outputs
from harness.runfolder import (
    BASELINE_JSON,
    GATES_JSON,
    RUN_JSON,
    figures,
    read_json,
    write_json,
)
from harness.scenario import Gate, needs_baseline


def conclude(
    run_dir: Path,
    facts: RunFacts,
    info: dict[str, Any],
    *,
    setup_failed: bool,
    baseline: tuple[Path, Baseline] | None = None,
    skip_relative: bool = False,
    report: bool = True,
    keep_baseline: bool = True,
    history: Path | None = None,
) -> RunResult:
    """Analyse ``run_dir``, gate it (against ``baseline``, if given; ``skip_relative``: see
    :func:`~harness.gates.evaluate_gates`) and write the results (module docstring);
    ``keep_baseline`` also copies the baseline into the run folder (``baseline.json``: the
    baseline the run was gated against, for ``zerowindow analyze``). ``info``
    is ``run.json`` as the run began it; the end of the run is added to it. A report that
    cannot be written is a warning on stderr and changes nothing else, and so are traces that
    cannot be sent to the OTLP endpoint (``[traces]``, ``harness.outputs._otlp_send``; sent
    again when a folder is analysed again). ``history``: the history file history gates read
    (``None``: none kept; recorded in ``run.json``)."""
    analysis = analyze(run_dir, facts)
    write_analysis(run_dir, analysis)
    traces = facts.scenario.traces
    if endpoint := traces_endpoint(traces.otlp_endpoint):
        sent = send_traces(analysis.traces, analysis.resource, analysis.version, endpoint,
                           timeout_s=traces.timeout_s)  # fmt: skip
        if sent is not None:
            print(f"warning: {sent}", file=sys.stderr)
    summary = analysis.summary
    gates: list[Gate] = list(facts.scenario.gates)
    # Per-request samples only when a gate will read them (they cost a pass over the chunks).
    samples = run_samples(analysis.requests, analysis.chunks) if gates else None
    evidence = Evidence([figures(summary)], samples) if samples is not None else None
    results = evaluate_gates(
        gates,
        figures(summary),
        baseline[1].figures if baseline else None,
        baseline_source=f"baseline {baseline[0]}" if baseline else "the baseline",
        skip_relative=skip_relative,
        evidence=evidence,
        baseline_evidence=baseline[1].evidence(baseline[0]) if baseline else None,
        policy=facts.scenario.gating,
        past=run_past(history, info, facts.proxy_name),
    )
    code = exit_code(summary.status, setup_failed=setup_failed, gates=results)
    result = RunResult(run_dir, summary, code, results, baseline[0] if baseline else None)
    write_json(
        run_dir / GATES_JSON,
        {
            "baseline": str(result.baseline) if result.baseline else None,
            "baseline_provenance": baseline[1].provenance if baseline else None,
            "skipped_relative": skip_relative,
            "gates": [vars(g) for g in results],
        },
    )
    if keep_baseline and baseline is not None:
        write_json(run_dir / BASELINE_JSON, baseline[1].model_dump(mode="json"))
    info.update(
        facts.as_dict(),
        history=str(history) if history else None,
        status=summary.status,
        failure=summary.failure,
        setup_failed=setup_failed,
        exit_code=code,
        client_saturated=summary.client_saturation.saturated,
        client_saturation=summary.client_saturation.message,
        gates={
            "passed": sum(g.passed and not g.skipped for g in results),
            "failed": sum(not g.passed for g in results),
            "skipped": sum(g.skipped for g in results),
            "baseline": str(result.baseline) if result.baseline else None,
        },
    )
    info.setdefault("ended_utc", datetime.now(UTC).isoformat())
    write_json(run_dir / RUN_JSON, info)
    units = [junit_run(summary, results, run_dir=run_dir, baseline=result.baseline)]
    for warning in write_outputs(Concluded(run_dir, units, report=report)):
        print(warning, file=sys.stderr)
    return result


def reanalyze_run(
    run_dir: Path, *, baseline: tuple[Path, Baseline] | None = None, use_baseline: bool = True
) -> RunResult:
    """``zerowindow analyze RUN_DIR``: :func:`conclude` again on a run folder written by an
    earlier run (on this machine or another), from what its ``run.json`` recorded. On an
    unchanged folder it reproduces ``summary.json`` and the gates' verdicts.

    Relative gates compare with ``baseline`` if given; else with the baseline the run was
    gated against (its copy ``baseline.json``; for older folders, the file ``gates.json``
    names); they are skipped with ``use_baseline=False``, or when the run itself skipped them.
    None of these choices changes ``baseline.json``. Raises
    :class:`~zwcore.RunFolderError` for a folder that is not a run folder and
    :class:`~harness.BaselineError` for a baseline that is needed and cannot be loaded."""
    info = read_json(run_dir / RUN_JSON)
    facts = read_facts(run_dir)
    history = Path(info["history"]) if info.get("history") else None
    setup_failed = bool(info.get("setup_failed", info.get("exit_code") == EXIT_SETUP))
    skip = not use_baseline
    if use_baseline and baseline is None and needs_baseline(facts.scenario.gates):
        baseline, skip = recorded_baseline(run_dir, facts.scenario.name)
    return conclude(
        run_dir, facts, info, setup_failed=setup_failed, baseline=baseline, skip_relative=skip,
        keep_baseline=False, history=history,
    )  # fmt: skip


def recorded_baseline(run_dir: Path, scenario: str) -> tuple[tuple[Path, Baseline] | None, bool]:
    """The baseline the run was gated against, and whether it skipped relative gates."""
    if (copy := run_dir / BASELINE_JSON).exists():
        return (copy, load_baseline(copy)), False
    if not (run_dir / GATES_JSON).exists():  # the run ended before its gates
        default = baseline_path(scenario)
        return (default, load_baseline(default)), False
    gates = read_json(run_dir / GATES_JSON)
    path = Path(gates["baseline"]) if gates.get("baseline") else None
    if path is None:
        return None, bool(gates.get("skipped_relative", True))
    return (path, load_baseline(path)), False
