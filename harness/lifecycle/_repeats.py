"""Repeats: one workload run several times against one target, gated on all of them at once.

``repeats = N`` in a scenario (or ``zerowindow run --repeats N``) runs the scenario's groups N
times against one target, started once and warmed up, each repeat once the engine is idle (a
series: ``harness.lifecycle._series``), into ``<run>/r1/``, ``<run>/r2/`` ... (complete run
folders; their own ``gates.json`` is empty: the gates are judged over all repeats). Then the
scenario's gates are evaluated on the :class:`~harness.analysis.Evidence` of every repeat
(figures with intervals: ``harness.analysis._uncertainty``) against the baseline's
(``harness.gates._evaluate``). With ``[gating] inconclusive = "rerun"``, while a gate is
inconclusive and ``max_reruns`` allows, one more repeat runs and the gates are evaluated again.

Into ``<run>/``: ``repeats.json`` (the series record with ``runs``, each figure's estimate,
interval and per-repeat values under ``figures``, and the gates), ``gates.json``,
``junit.xml``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.analysis import estimate, evidence_of, impact, pooled_figures
from harness.gates import Baseline, GateResult, evaluate_gates, wants_rerun
from harness.lifecycle._conclude import EXIT_OK, RunResult, exit_code
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._inputs import baseline_for
from harness.lifecycle._series import Series, run_series
from harness.outputs import write_junit
from harness.runfolder import GATES_JSON, REPEATS_JSON, read_json, write_json
from harness.scenario import Scenario, ScenarioError


@dataclass
class RepeatsResult:
    """What a run with repeats produced: the parent folder, each repeat's run (in order), the
    gates evaluated over all of them, each figure's estimate (``figures``: name -> value, low,
    high, per_repeat, method), the baseline file used, and the exit code (0 complete and every
    gate passed, 1 a repeat failed or a gate failed, 2 the target could not start, 130
    interrupted) with why it is not 0. With a control arm: its runs (``controls``, one per
    repeat) and the ``impact`` figures (``harness.analysis.impact``)."""

    run_dir: Path
    runs: list[RunResult] = field(default_factory=list)
    gates: list[GateResult] = field(default_factory=list)
    figures: dict[str, dict[str, object]] = field(default_factory=dict)
    baseline: Path | None = None
    exit_code: int = EXIT_OK
    failure: str | None = None
    controls: list[RunResult] = field(default_factory=list)
    impact: dict[str, float | None] = field(default_factory=dict)


def run_repeats(
    scenario: Scenario,
    *,
    repeats: int | None = None,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    target_url: str | None = None,
    baseline: Path | None = None,
    use_baseline: bool = True,
    distribution: Distribution | None = None,
) -> RepeatsResult:
    """Run ``scenario`` ``repeats`` times (default: its own ``repeats``) against one target
    (module docstring) under ``out_root/<name>/<UTC timestamp>/``. ``baseline`` and
    ``use_baseline`` are as for :func:`~harness.lifecycle.run_scenario`. Never raises for
    failures of the target or the load (they end up in ``repeats.json`` and the exit code).
    Raises, before anything starts, :class:`~harness.scenario._models.ScenarioError` for a
    scenario with ``proxies`` (a comparison runs each configuration once),
    :class:`~harness.BaselineError` for a baseline that is needed and cannot be loaded, and
    what :func:`~harness.lifecycle._series.run_series` raises."""
    if scenario.proxies:
        raise ScenarioError("repeats with proxies = [...] are not supported: run each alone")
    count = repeats or scenario.repeats
    base = baseline_for(scenario, baseline, use=use_baseline)
    base_evidence = base[1].evidence(base[0]) if base is not None else None
    policy = scenario.gating
    done: list[RunResult] = []
    controls: list[RunResult] = []
    gates: list[GateResult] = []
    figures: dict[str, dict[str, object]] = {}
    impacts: dict[str, float | None] = {}
    victims = [g.name for g in scenario.groups if not g.aggressor]
    without = scenario.model_copy(
        update={"gates": [], "groups": [g for g in scenario.groups if not g.aggressor]}
    )

    def judge(*, final: bool) -> list[GateResult]:
        evidence = evidence_of([r.run_dir for r in done])
        pooled = pooled_figures(evidence)
        figures.clear()
        for name in pooled:
            est = estimate(evidence, name, confidence=policy.confidence, n=policy.bootstrap_draws)
            figures[name] = est.as_dict()
        if controls:
            impacts.update(
                impact(
                    evidence,
                    evidence_of([r.run_dir for r in controls]),
                    victims,
                    confidence=policy.confidence,
                    n=policy.bootstrap_draws,
                )  # fmt: skip
            )
            pooled.update(impacts)
        return evaluate_gates(
            scenario.gates,
            pooled,
            _figures(base),
            baseline_source=f"baseline {base[0]}" if base else "the baseline",
            skip_relative=not use_baseline,
            evidence=evidence,
            baseline_evidence=base_evidence,
            policy=policy,
            final=final,
        )

    def body(series: Series) -> None:
        nonlocal gates
        ungated = scenario.model_copy(update={"gates": []})
        for i in range(count + policy.max_reruns):
            name = f"r{i + 1}"
            series.info["runs"].append(name)
            done.append(series.run(name, ungated))
            if scenario.control:  # the same schedule without the aggressors
                series.info["controls"].append(f"c{i + 1}")
                controls.append(series.run(f"c{i + 1}", without))
            if i + 1 < count:
                continue
            last = i + 1 == count + policy.max_reruns  # out of reruns: judged as final
            gates = judge(final=last)
            if last or not wants_rerun(gates, policy):
                return

    result = run_series(
        scenario, body,
        record=REPEATS_JSON, scenario_path=scenario_path, out_root=out_root,
        target_url=target_url, distribution=distribution,
        info={"repeats": count, "runs": [], "controls": []},
    )  # fmt: skip
    out = RepeatsResult(result.run_dir, done, gates, dict(figures), base[0] if base else None)
    out.controls, out.impact = controls, impacts
    out.exit_code, out.failure = result.exit_code, result.failure
    if out.exit_code == EXIT_OK and done:
        out.exit_code = exit_code(_status(done + controls), setup_failed=False, gates=gates)
    _write(out, base)
    return out


def _status(runs: list[RunResult]) -> str:
    """``complete`` when every repeat completed, else the first other status."""
    return next((r.summary.status for r in runs if r.summary.status != "complete"), "complete")


def _figures(base: tuple[Path, Baseline] | None) -> dict[str, float | None] | None:
    return base[1].figures if base is not None else None


def _write(out: RepeatsResult, base: tuple[Path, Baseline] | None) -> None:
    """``gates.json``, ``junit.xml`` and the end of ``repeats.json`` in the parent folder."""
    write_json(
        out.run_dir / GATES_JSON,
        {
            "baseline": str(out.baseline) if out.baseline else None,
            "baseline_provenance": base[1].provenance if base else None,
            "repeats": [r.run_dir.name for r in out.runs],
            "gates": [vars(g) for g in out.gates],
        },
    )
    record = read_json(out.run_dir / REPEATS_JSON)
    record.update(
        figures=out.figures,
        impact=out.impact,
        gates=[vars(g) for g in out.gates],
        exit_code=out.exit_code,
        failure=out.failure,
    )
    write_json(out.run_dir / REPEATS_JSON, record)
    if out.runs:
        last = out.runs[-1].summary
        summary = last.model_copy(
            update={
                "duration_s": sum(r.summary.duration_s for r in out.runs),
                "status": _status(out.runs),
                "failure": out.failure,
            }
        )
        write_junit(
            out.run_dir / "junit.xml",
            summary,
            out.gates,
            run_dir=out.run_dir,
            baseline=out.baseline,
        )
