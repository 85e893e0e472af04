"""Gate evaluation: a scenario's gates (:mod:`harness.scenario`) against a run's figures and,
for relative gates, a baseline's, knowing the noise of both.

Verdicts:

- an **absolute** gate (``fast.ttft_p99_ms <= 800``) compares the figure as measured (over
  repeats: the pooled or mean figure) with the bound: ``pass`` or ``fail``; its interval, when
  there is one, is shown beside it;
- a **relative** gate (``fast.ttft_p99_ms <= 1.2 * baseline``) with :class:`Evidence` on both
  sides draws the run's figure and the bound (from the baseline's figure) independently
  (``harness.analysis._uncertainty``) and looks at the interval of ``figure - bound``: ``pass``
  when the comparison holds across it, ``fail`` when it is broken across it, ``inconclusive``
  when the interval straddles the bound. Without evidence, or for ``==``, the figures are
  compared as they are;
- a **distribution** gate (``fast.ttft_ms ~ baseline within 10%``) looks at the ratio of the
  medians and its interval: ``pass`` when the interval lies within ``1 ± within``, ``fail``
  when it lies wholly outside and the Mann-Whitney U p-value is below ``alpha``,
  ``inconclusive`` otherwise;
- a **history** gate (``fast.ttft_p99_ms ~ history within 10%``) looks at the figure over the
  runs of its series before this one and this one (:func:`harness.history.judge_trend`):
  ``fail`` when the newest runs lie after change points that worsen it beyond ``within``,
  else ``pass``; ``skipped`` when the run keeps no history on purpose, or its history cannot
  be read (a file locked by another job too long, not a history): a warning, never a failure.

A gate on a figure that was not measured (``None``) fails, saying so; but a gate on a figure
of something that was **not exercised** (its owner's ``<owner>.exercised`` figure is 0: a
disconnect-matrix cell none of whose clients left in its phase,
:meth:`harness.runfolder.MatrixCell.figures`) is ``inconclusive``, whatever the figure's
value: it is about something that did not happen, so it is never a pass, nor the stack's
failure.

What an inconclusive gate does is the scenario's ``[gating] inconclusive`` policy
(:class:`~harness.scenario.GatingConfig`): ``fail``, ``warn`` (passes, saying so), or
``rerun`` (the caller adds a repeat while :func:`wants_rerun` says so; once it may not,
as ``warn``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from harness.analysis import (
    Evidence,
    draws,
    estimate,
    interval,
    median_ratio,
    p_value,
    ratio_draws,
)
from harness.history import Past, judge_trend
from harness.scenario import OPS, Gate, GatingConfig
from zwcore import HistoryError

PASS, FAIL, INCONCLUSIVE, SKIPPED = "pass", "fail", "inconclusive", "skipped"


@dataclass(frozen=True)
class GateResult:
    """One gate evaluated: ``measured`` is this run's figure, ``baseline`` the baseline's (for a
    relative gate), ``bound`` what it was compared with; ``None`` where there was no value.
    ``reason`` is one line a person reads: the numbers, their intervals, the effect and the
    p-value, or why the gate could not pass. ``verdict`` is ``pass``, ``fail``,
    ``inconclusive`` or ``skipped``; ``passed`` applies the policy to it (a ``skipped`` gate,
    relative and evaluated without a baseline on purpose, counts as passed).

    ``low``/``high``: the interval of ``measured``; ``baseline_low``/``baseline_high``: the
    baseline's; ``effect``: measured / baseline (for a distribution gate: the ratio of the
    medians) with ``effect_low``/``effect_high``; ``p_value`` of ``test``
    (``mann-whitney-u`` or ``welch-t``)."""

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
    verdict: str = PASS
    low: float | None = None
    high: float | None = None
    baseline_low: float | None = None
    baseline_high: float | None = None
    effect: float | None = None
    effect_low: float | None = None
    effect_high: float | None = None
    p_value: float | None = None
    test: str | None = None

    @property
    def inconclusive(self) -> bool:
        return self.verdict == INCONCLUSIVE


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.6g}"


def _span(low: float | None, high: float | None) -> str:
    return "" if low is None or high is None else f" [{low:.4g}, {high:.4g}]"


def _effect_text(effect: float | None, low: float | None, high: float | None) -> str:
    return "" if effect is None else f"; effect x{effect:.3g}{_span(low, high)}"


def _p_text(p: float | None) -> str:
    return "" if p is None else f", p = {p:.3g}"


def evaluate_gates(
    gates: Iterable[Gate],
    figures: Mapping[str, float | None],
    baseline: Mapping[str, float | None] | None = None,
    *,
    baseline_source: str = "the baseline",
    skip_relative: bool = False,
    evidence: Evidence | None = None,
    baseline_evidence: Evidence | None = None,
    policy: GatingConfig | None = None,
    final: bool = True,
    past: Past | None = None,
) -> list[GateResult]:
    """Evaluate ``gates`` against this run's ``figures`` (from :func:`harness.runfolder.figures`,
    or the estimates over repeats) and, for relative gates, the ``baseline`` figures (module
    docstring). ``evidence`` and ``baseline_evidence`` (per-repeat figures and per-request
    samples) give the intervals; without them relative gates compare the figures as they are
    and distribution gates fail for want of samples. Never raises for missing values: a gate
    without a measured value or without a baseline value fails with that reason, one whose
    figure's owner was not exercised (``<owner>.exercised`` is 0) is inconclusive.
    ``baseline_source`` names the baseline in reasons (e.g. its path). With ``skip_relative``
    (and no ``baseline``) relative gates are reported as skipped instead of failed: for the
    first run of a scenario, whose folder then becomes the baseline. ``policy`` (default
    :class:`~harness.scenario.GatingConfig`) decides what an inconclusive gate does; with
    ``final=False`` the ``rerun`` policy fails it (the caller reruns), else it warns.
    ``past`` gives a figure's values in the runs of this run's series before it, for history
    gates (:func:`harness.history.past_of`; ``None``: no history kept, they are skipped)."""
    policy = policy or GatingConfig()
    return [
        _history(gate, figures, past, policy, final)
        if gate.history
        else _evaluate(
            gate,
            figures,
            baseline,
            baseline_source,
            skip_relative,
            evidence,
            baseline_evidence,
            policy,
            final,
        )  # fmt: skip
        for gate in gates
    ]


def _history(
    gate: Gate,
    figures: Mapping[str, float | None],
    past: Past | None,
    policy: GatingConfig,
    final: bool,
) -> GateResult:
    """A history gate (module docstring)."""
    measured = figures.get(gate.figure)
    plain = GateResult(gate.text, gate.figure, gate.op, False, measured, None, None, False, "")
    if (idle := not_exercised(gate.figure, figures)) is not None:
        return _with(plain, INCONCLUSIVE, idle, policy, final)
    if past is None:
        why = f"skipped: this run keeps no history on purpose (measured {_num(measured)})"
        return _with(plain, SKIPPED, why, policy, final, skipped=True)
    if measured is None:
        return _with(plain, FAIL, f"{gate.figure} was not measured in this run", policy, final)
    try:
        values = [*past(gate.figure), measured]
    except HistoryError as exc:  # history trouble never changes a run's exit code
        why = f"skipped: the history cannot be read: {exc}"
        return _with(plain, SKIPPED, why, policy, final, skipped=True)
    trend = judge_trend(
        values, gate.figure, within=gate.within, max_pvalue=policy.history_max_pvalue,
        confidence=policy.confidence,
    )  # fmt: skip
    verdict = FAIL if trend.failed else PASS
    return _with(plain, verdict, f"measured {_num(measured)}; {trend.reason}", policy, final,
                 effect=None if trend.change is None else 1 + trend.change)  # fmt: skip


def wants_rerun(results: Iterable[GateResult], policy: GatingConfig) -> bool:
    """Whether ``policy`` asks for another repeat: it is ``rerun`` and a gate is inconclusive."""
    return policy.inconclusive == "rerun" and any(r.inconclusive for r in results)


def _evaluate(
    gate: Gate,
    figures: Mapping[str, float | None],
    baseline: Mapping[str, float | None] | None,
    baseline_source: str,
    skip_relative: bool,
    evidence: Evidence | None,
    baseline_evidence: Evidence | None,
    policy: GatingConfig,
    final: bool,
) -> GateResult:
    measured = figures.get(gate.figure)
    base = baseline.get(gate.figure) if gate.relative and baseline is not None else None
    plain = GateResult(
        gate.text, gate.figure, gate.op, gate.relative, measured, base, gate.bound(base), False, ""
    )
    if gate.relative and baseline is None and skip_relative:
        why = f"skipped: no baseline on purpose (measured {_num(measured)})"
        return _with(plain, SKIPPED, why, policy, final, skipped=True)
    if (idle := not_exercised(gate.figure, figures)) is not None:
        return _with(plain, INCONCLUSIVE, idle, policy, final)
    if gate.relative and baseline is None:
        return _with(plain, FAIL, "no baseline was loaded for this relative gate", policy, final)
    if gate.distribution:
        return _distribution(
            plain, gate, evidence, baseline_evidence, baseline_source, policy, final
        )
    if gate.relative and base is None:
        why = f"{baseline_source} has no value for {gate.figure}"
        return _with(plain, FAIL, why, policy, final)
    if measured is None:
        return _with(plain, FAIL, f"{gate.figure} was not measured in this run", policy, final)
    if gate.relative and gate.op != "==" and evidence is not None and baseline_evidence is not None:
        if judged := _relative(plain, gate, evidence, baseline_evidence, policy, final):
            return judged
    assert plain.bound is not None
    low = high = None
    if evidence is not None:
        est = estimate(
            evidence, gate.figure, confidence=policy.confidence, n=policy.bootstrap_draws
        )
        low, high = est.low, est.high
    verdict = PASS if OPS[gate.op](measured, plain.bound) else FAIL
    reason = f"measured {_num(measured)}{_span(low, high)}, bound {gate.op} {_num(plain.bound)}"
    reason += _relative_text(gate, base)
    return _with(plain, verdict, reason, policy, final, low=low, high=high)


def not_exercised(figure: str, figures: Mapping[str, float | None]) -> str | None:
    """Why ``figure`` is about something that did not happen, or ``None``: one line naming
    the owner (a part of the figure's name) whose ``<owner>.exercised`` figure is 0, and,
    from its ``<owner>.left_in.<phase>`` figures, where its clients left instead."""
    for owner in figure.split(".")[:-1]:
        if figures.get(f"{owner}.exercised") != 0.0:
            continue
        head = f"{owner}.left_in."
        where = [f"{n[len(head):]} {v:g}" for n, v in sorted(figures.items())
                 if n.startswith(head) and v]  # fmt: skip
        instead = f"; they left in {', '.join(where)}" if where else ""
        value = figures.get(figure)
        measured = "was not measured" if value is None else f"measured {_num(value)}"
        return (
            f"{owner} was not exercised (none of its clients left in the phase it is named "
            f"for{instead}): {figure} {measured}, about something that did not happen"
        )
    return None


def _relative_text(gate: Gate, base: float | None, low: float | None = None,
                   high: float | None = None) -> str:  # fmt: skip
    if not gate.relative:
        return ""
    text = f" ({gate.factor:g} * baseline {_num(base)}{_span(low, high)}"
    if gate.offset:
        text += f" {'+' if gate.offset > 0 else '-'} {abs(gate.offset):g}"
    return text + ")"


def _relative(
    plain: GateResult,
    gate: Gate,
    evidence: Evidence,
    baseline_evidence: Evidence,
    policy: GatingConfig,
    final: bool,
) -> GateResult | None:
    """The relative gate judged on intervals; ``None`` when either side has no draws of the
    figure (the caller then compares the figures as they are)."""
    n, conf = policy.bootstrap_draws, policy.confidence
    rng = np.random.default_rng(0)
    c = draws(evidence, gate.figure, n=n, rng=rng)
    b = draws(baseline_evidence, gate.figure, n=n, rng=rng)
    if c is None or b is None:
        return None
    bound_draws = gate.factor * b + gate.offset
    d_low, d_high = interval(c - bound_draws, conf)
    below = gate.op in ("<", "<=")
    worst, best = (d_high, d_low) if below else (d_low, d_high)
    if OPS[gate.op](worst, 0.0):
        verdict = PASS
    elif not OPS[gate.op](best, 0.0):
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    low, high = interval(c, conf)
    b_low, b_high = interval(b, conf)
    # The effect from the same draws the verdict used (no second bootstrap of either side).
    ratios = ratio_draws(c, b)
    effect = (
        plain.measured / plain.baseline if plain.measured is not None and plain.baseline else None
    )
    e_low, e_high = (
        interval(ratios, conf) if ratios is not None and effect is not None else (None, None)
    )
    p, test = p_value(evidence, baseline_evidence, gate.figure)
    reason = (
        f"measured {_num(plain.measured)}{_span(low, high)}, bound {gate.op} {_num(plain.bound)}"
        f"{_relative_text(gate, plain.baseline, b_low, b_high)}"
        f"{_effect_text(effect, e_low, e_high)}{_p_text(p)}"
    )
    return _with(
        plain, verdict, reason, policy, final, low=low, high=high, baseline_low=b_low,
        baseline_high=b_high, effect=effect, effect_low=e_low, effect_high=e_high,
        p_value=p, test=test,
    )  # fmt: skip


def _distribution(
    plain: GateResult,
    gate: Gate,
    evidence: Evidence | None,
    baseline_evidence: Evidence | None,
    baseline_source: str,
    policy: GatingConfig,
    final: bool,
) -> GateResult:
    if evidence is None or not len(evidence.sample(gate.figure)):
        why = f"{gate.figure} was not measured in this run (no samples)"
        return _with(plain, FAIL, why, policy, final)
    if baseline_evidence is None or not len(baseline_evidence.sample(gate.figure)):
        why = (
            f"{baseline_source} has no samples of {gate.figure} (saved before baselines kept "
            "them? save it again with `zerowindow baseline save`)"
        )
        return _with(plain, FAIL, why, policy, final)
    diff = median_ratio(
        evidence, baseline_evidence, gate.figure, confidence=policy.confidence,
        n=policy.bootstrap_draws,
    )  # fmt: skip
    lo, hi = 1.0 - gate.within, 1.0 + gate.within
    low, high = diff.ratio_low, diff.ratio_high
    if low is None or high is None:  # a median of 0 in the baseline's draws: no ratio
        verdict = INCONCLUSIVE
    elif lo <= low and high <= hi:
        verdict = PASS
    elif (high < lo or low > hi) and _below(diff.p_value, policy.alpha):
        verdict = FAIL
    else:
        verdict = INCONCLUSIVE
    measured = float(np.median(evidence.sample(gate.figure)["value"]))
    base = float(np.median(baseline_evidence.sample(gate.figure)["value"]))
    effect = _effect_text(diff.ratio, low, high) if low is not None else "; no ratio of medians"
    reason = (
        f"median {_num(measured)} vs baseline {_num(base)}{effect}{_p_text(diff.p_value)}"
        f"; same within {gate.within:.0%} when the effect's interval is inside "
        f"[{lo:.3g}, {hi:.3g}]"
    )
    if low is None:
        reason += " (the baseline's median is 0 in some draws)"
    return _with(
        plain, verdict, reason, policy, final, measured=measured, baseline=base,
        effect=diff.ratio, effect_low=diff.ratio_low, effect_high=diff.ratio_high,
        p_value=diff.p_value, test=diff.test,
    )  # fmt: skip


def _below(p: float | None, alpha: float) -> bool:
    return p is not None and p < alpha


def _with(
    plain: GateResult,
    verdict: str,
    reason: str,
    policy: GatingConfig,
    final: bool,
    **fields: object,
) -> GateResult:
    """``plain`` with its verdict, reason and ``fields``; ``passed`` from the policy."""
    passed = verdict in (PASS, SKIPPED)
    if verdict == INCONCLUSIVE:
        policy_now = policy.inconclusive
        if policy_now == "rerun" and final:
            policy_now = "warn"
        passed = policy_now == "warn"
        what = {
            "warn": "passes with a warning",
            "fail": "fails (inconclusive = 'fail')",
            "rerun": "another repeat is needed",
        }
        reason = f"inconclusive, {what[policy_now]}: {reason}"
    values = {**vars(plain), **fields, "verdict": verdict, "passed": passed, "reason": reason}
    return GateResult(**values)  # type: ignore[arg-type]
