"""Gate evaluation: a scenario's gates (:mod:`harness.scenario`) against a run's figures and,
for relative gates, a baseline's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from harness.scenario import OPS, Gate


@dataclass(frozen=True)
class GateResult:
    """One gate evaluated: ``measured`` is this run's figure, ``baseline`` the baseline's (for a
    relative gate), ``bound`` what it was compared with; ``None`` where there was no value.
    ``reason`` is one line a person reads: the numbers, or why the gate could not pass. A
    ``skipped`` gate (relative, evaluated without a baseline on purpose) counts as passed."""

    gate: str
    figure: str
    op: str
    relative: bool
    measured: float | None
    baseline: float | None
    bound: float | None
    passed: bool
    reason: str
    skipped: bool = False


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def evaluate_gates(
    gates: Iterable[Gate],
    figures: Mapping[str, float | None],
    baseline: Mapping[str, float | None] | None = None,
    *,
    baseline_source: str = "the baseline",
    skip_relative: bool = False,
) -> list[GateResult]:
    """Evaluate ``gates`` against this run's ``figures`` (from :func:`harness.runfolder.figures`)
    and, for relative gates, the ``baseline`` figures. Never raises for missing values: a gate
    without a measured value or without a baseline value fails with that reason.
    ``baseline_source`` names the baseline in reasons (e.g. its path). With ``skip_relative``
    (and no ``baseline``) relative gates are reported as skipped instead of failed: for the
    first run of a scenario, whose folder then becomes the baseline."""
    results = []
    for gate in gates:
        measured = figures.get(gate.figure)
        base = None
        if gate.relative and baseline is not None:
            base = baseline.get(gate.figure)
        bound = gate.bound(base)
        skipped = False
        if gate.relative and baseline is None and skip_relative:
            passed, skipped = True, True
            reason = f"skipped: no baseline on purpose (measured {_num(measured)})"
        elif gate.relative and baseline is None:
            passed, reason = False, "no baseline was loaded for this relative gate"
        elif gate.relative and base is None:
            passed, reason = False, f"{baseline_source} has no value for {gate.figure}"
        elif measured is None:
            passed, reason = False, f"{gate.figure} was not measured in this run"
        else:
            assert bound is not None
            passed = OPS[gate.op](measured, bound)
            rel = f" ({gate.factor:g} * baseline {_num(base)}" if gate.relative else ""
            if gate.relative and gate.offset:
                rel += f" {'+' if gate.offset > 0 else '-'} {abs(gate.offset):g}"
            rel += ")" if rel else ""
            reason = f"measured {_num(measured)}, bound {gate.op} {_num(bound)}{rel}"
        results.append(
            GateResult(
                gate=gate.text,
                figure=gate.figure,
                op=gate.op,
                relative=gate.relative,
                measured=measured,
                baseline=base,
                bound=bound,
                passed=passed,
                reason=reason,
                skipped=skipped,
            )
        )
    return results
