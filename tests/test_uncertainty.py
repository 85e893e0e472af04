"""Figures with intervals and noise-aware gates (no server: synthetic evidence; the runs with
repeats are in test_repeats.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.analysis import Evidence, estimate, impact, median_ratio, run_samples
from harness.gates import evaluate_gates, wants_rerun
from harness.runfolder import impact_names
from harness.scenario import GateSyntaxError, GatingConfig, ScenarioError, parse_gate
from harness.scenario import parse_scenario as parse


def _evidence(*repeats: np.ndarray, kind: str = "fast.ttft_ms") -> Evidence:
    """Evidence whose repeats have these per-request values of sample ``kind``."""
    frames = [
        pd.DataFrame({"repeat": r, "request": np.arange(len(v)), "sample": kind, "value": v})
        for r, v in enumerate(repeats)
    ]
    figures = [
        {"fast.ttft_p50_ms": float(np.median(v)), "server.preemptions": float(r)}
        for r, v in enumerate(repeats)
    ]
    return Evidence(figures, pd.concat(frames, ignore_index=True))


def _lognormal(seed: int, n: int = 300, scale: float = 1.0) -> np.ndarray:
    return scale * np.random.default_rng(seed).lognormal(3.0, 0.4, n)


def test_run_samples_follow_the_latency_definitions() -> None:
    requests = pd.DataFrame(
        {
            "request_id": ["a", "b"],
            "group": ["fast", "fast"],
            "ttft_ms": [10.0, np.nan],
            "e2e_ms": [40.0, 50.0],
        }
    )
    # Stream a: first token at 0.010, then 2 tokens 10 ms later (two ITL values of 5 ms), then
    # one token 20 ms later.
    chunks = pd.DataFrame(
        {
            "request_id": ["a", "a", "a"],
            "group": ["fast"] * 3,
            "t": [0.010, 0.020, 0.040],
            "tokens": [1, 2, 1],
        }
    )
    samples = run_samples(requests, chunks, repeat=2)
    by = samples.groupby("sample")["value"].apply(list).to_dict()
    assert by["fast.ttft_ms"] == [10.0]  # a request without TTFT gives none
    assert by["fast.e2e_ms"] == [40.0, 50.0]
    assert by["fast.itl_ms"] == pytest.approx([5.0, 5.0, 20.0])
    assert by["fast.inter_chunk_ms"] == pytest.approx([10.0, 20.0])
    assert set(samples["repeat"]) == {2}


def test_the_bootstrap_interval_holds_the_pooled_figure_and_widens_with_repeat_spread() -> None:
    alike = _evidence(_lognormal(1), _lognormal(2), _lognormal(3))
    apart = _evidence(_lognormal(1, scale=0.8), _lognormal(2), _lognormal(3, scale=1.25))
    a = estimate(alike, "fast.ttft_p50_ms")
    b = estimate(apart, "fast.ttft_p50_ms")
    pooled = np.median(np.concatenate([_lognormal(1), _lognormal(2), _lognormal(3)]))
    assert a.method == "bootstrap" and a.value == pytest.approx(pooled)
    assert a.low < a.value < a.high
    assert (b.high - b.low) > 2 * (a.high - a.low)  # the spread between repeats counts
    assert len(a.per_repeat) == 3


def test_one_run_still_has_an_interval_from_its_requests() -> None:
    one = estimate(_evidence(_lognormal(1)), "fast.ttft_p50_ms")
    # The median of 300 lognormal draws (sigma 0.4): a few percent either way.
    assert one.low < one.value < one.high
    assert 0.01 < (one.high - one.low) / one.value < 0.2


def test_run_level_figures_get_a_student_t_interval_over_repeats() -> None:
    ev = Evidence([{"server.preemptions": v} for v in (10.0, 12.0, 14.0)])
    est = estimate(ev, "server.preemptions", n=20000)
    half = stats.t.ppf(0.975, 2) * np.std([10, 12, 14], ddof=1) / np.sqrt(3)
    assert est.method == "t" and est.value == 12.0
    assert est.low == pytest.approx(12 - half, rel=0.05)
    assert est.high == pytest.approx(12 + half, rel=0.05)
    single = estimate(Evidence([{"server.preemptions": 3.0}]), "server.preemptions")
    assert (single.method, single.low, single.high) == ("single", None, None)
    assert estimate(ev, "no.such_figure").method == "none"


GATE = "fast.ttft_p50_ms <= 1.25 * baseline"


def _judge(candidate: Evidence, baseline: Evidence, gate: str = GATE, **policy: object):
    figures = {"fast.ttft_p50_ms": estimate(candidate, "fast.ttft_p50_ms").value}
    base = {"fast.ttft_p50_ms": estimate(baseline, "fast.ttft_p50_ms").value}
    return evaluate_gates(
        [parse_gate(gate)],
        figures,
        base,
        evidence=candidate,
        baseline_evidence=baseline,
        policy=GatingConfig(**policy),  # type: ignore[arg-type]
    )[0]


def test_a_relative_gate_passes_fails_or_is_inconclusive() -> None:
    base = _evidence(_lognormal(1), _lognormal(2), _lognormal(3))
    same = _evidence(_lognormal(4), _lognormal(5), _lognormal(6))
    slower = _evidence(*(_lognormal(s, scale=1.6) for s in (4, 5, 6)))
    edge = _evidence(*(_lognormal(s, scale=1.25) for s in (4, 5, 6)))
    assert _judge(same, base).verdict == "pass"
    failed = _judge(slower, base)
    assert failed.verdict == "fail" and not failed.passed
    assert failed.effect == pytest.approx(1.6, rel=0.1) and failed.effect_low > 1.25
    assert "effect x1.6" in failed.reason and "p = " in failed.reason and "[" in failed.reason
    warned = _judge(edge, base)
    assert warned.verdict == "inconclusive" and warned.passed  # the default policy: warn
    assert "inconclusive, passes with a warning" in warned.reason
    assert not _judge(edge, base, inconclusive="fail").passed


def test_the_rerun_policy_asks_for_repeats_then_warns() -> None:
    base = _evidence(_lognormal(1), _lognormal(2), _lognormal(3))
    edge = _evidence(*(_lognormal(s, scale=1.25) for s in (4, 5, 6)))
    policy = GatingConfig(inconclusive="rerun")
    figures = {"fast.ttft_p50_ms": estimate(edge, "fast.ttft_p50_ms").value}
    base_figures = {"fast.ttft_p50_ms": estimate(base, "fast.ttft_p50_ms").value}
    kwargs = dict(evidence=edge, baseline_evidence=base, policy=policy)
    early = evaluate_gates([parse_gate(GATE)], figures, base_figures, final=False, **kwargs)
    assert wants_rerun(early, policy) and not early[0].passed
    assert "another repeat is needed" in early[0].reason
    last = evaluate_gates([parse_gate(GATE)], figures, base_figures, final=True, **kwargs)
    assert last[0].inconclusive and last[0].passed
    assert not wants_rerun(early, GatingConfig(inconclusive="warn"))


def test_without_evidence_a_relative_gate_compares_figures_as_before() -> None:
    gate = parse_gate(GATE)
    (result,) = evaluate_gates([gate], {"fast.ttft_p50_ms": 100.0}, {"fast.ttft_p50_ms": 95.0})
    assert result.verdict == "pass" and result.low is None
    (result,) = evaluate_gates([gate], {"fast.ttft_p50_ms": 120.0}, {"fast.ttft_p50_ms": 95.0})
    assert result.verdict == "fail"


def test_a_distribution_gate_compares_medians_with_a_threshold() -> None:
    base = _evidence(_lognormal(1), _lognormal(2), _lognormal(3))
    same = _evidence(_lognormal(4), _lognormal(5), _lognormal(6))
    shifted = _evidence(*(_lognormal(s, scale=1.3) for s in (4, 5, 6)))
    gate = "fast.ttft_ms ~ baseline within 15%"
    assert _judge(same, base, gate).verdict == "pass"
    failed = _judge(shifted, base, gate)
    assert failed.verdict == "fail" and failed.p_value < 1e-6 and failed.test == "mann-whitney-u"
    diff = median_ratio(shifted, base, "fast.ttft_ms")
    assert diff.ratio_low < 1.3 < diff.ratio_high
    old = Evidence([{"fast.ttft_p50_ms": 20.0}])  # a format-1 baseline: no samples
    missing = _judge(same, old, gate)
    assert missing.verdict == "fail" and "has no samples of fast.ttft_ms" in missing.reason


def test_distribution_gate_syntax() -> None:
    gate = parse_gate("fast.itl_ms ~ baseline within 5%")
    assert gate.distribution and gate.relative and gate.within == pytest.approx(0.05)
    assert parse_gate("fast.itl_ms ~ baseline").within == pytest.approx(0.10)
    for text, expected in (
        ("fast.itl_ms ~ 5", "expected 'baseline' or 'history' after '~'"),
        ("fast.itl_ms ~ baseline within 5", "expected 'within N%'"),
        ("fast.itl_ms ~ baseline by 5%", "expected 'within N%'"),
    ):
        with pytest.raises(GateSyntaxError, match=expected):
            parse_gate(text)


SCENARIO = """
name = "t"
{control}
gates = [{gate!r}]
[target]
kind = "sim"
[[groups]]
name = "fast"
users = 1
requests_per_user = 1
[[groups]]
name = "slow"
{aggressor}
users = 1
requests_per_user = 1
"""


def _parse(gate: str, *, control: bool = False, aggressor: bool = True) -> None:
    text = SCENARIO.format(
        gate=gate,
        control="control = true" if control else "",
        aggressor="aggressor = true" if aggressor else "",
    )
    parse(text, path=Path("t.toml"))


def test_a_distribution_gate_names_a_sample() -> None:
    _parse("fast.ttft_ms ~ baseline")
    with pytest.raises(ScenarioError) as exc:
        _parse("fast.ttft_p99_ms ~ baseline")
    assert "unknown sample 'fast.ttft_p99_ms'" in str(exc.value)
    assert "fast.ttft_ms" in str(exc.value)
    with pytest.raises(ScenarioError) as exc:
        _parse("fast.ttft_ms <= 5")
    assert "unknown figure 'fast.ttft_ms'" in str(exc.value)


def test_impact_is_a_ratio_for_victims_and_a_difference_for_the_server() -> None:
    control = _evidence(_lognormal(1), _lognormal(2))
    hurt = _evidence(*(_lognormal(s, scale=2.0) for s in (3, 4)))
    out = impact(hurt, control, ["fast"])
    assert out["impact.fast.ttft_p50"] == pytest.approx(2.0, rel=0.1)
    assert 1.0 < out["impact.fast.ttft_p50_low"] < 2.0 < out["impact.fast.ttft_p50_high"]
    # server.preemptions is 0 then 1 in each arm (see _evidence): no difference.
    assert out["impact.server.preemptions"] == 0.0
    assert out["impact.fast.itl_p99"] is None  # neither arm measured it
    assert set(out) == set(impact_names(["fast"]))


def test_impact_figures_are_valid_gate_figures_only_with_a_control_arm() -> None:
    _parse("impact.fast.ttft_p99_low <= 1.5", control=True)
    with pytest.raises(ScenarioError, match="unknown figure 'impact.fast.ttft_p99_low'"):
        _parse("impact.fast.ttft_p99_low <= 1.5")
    with pytest.raises(ScenarioError, match="control = true needs aggressor groups"):
        _parse("fast.ttft_p99_ms <= 5", control=True, aggressor=False)


def test_a_median_of_zero_leaves_a_distribution_gate_inconclusive() -> None:
    # Reads that return several events at once stamp them alike: ITL values of 0 ms.
    zeros = _evidence(np.zeros(200), np.zeros(200), kind="fast.itl_ms")
    result = _judge(zeros, zeros, "fast.itl_ms ~ baseline")
    assert result.verdict == "inconclusive" and "no ratio of medians" in result.reason


def test_an_impact_gate_without_a_control_arm_says_what_it_needs() -> None:
    with pytest.raises(ScenarioError, match="impact figures need control = true"):
        _parse("impact.fast.ttft_p99 <= 2")
