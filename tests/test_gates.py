"""Gates: the grammar, evaluation, scenario-load errors, junit.xml and the step summary (no
server needed; the runs are in test_gates_run.py)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from harness.gates._baseline import BaselineError, load_baseline
from harness.gates._evaluate import evaluate_gates, wants_rerun
from harness.outputs import junit_run, junit_xml
from harness.outputs._step_summary import step_summary_markdown
from harness.scenario import (
    GateSyntaxError,
    GatingConfig,
    ScenarioError,
    parse_gate,
    parse_scenario,
)
from tests.test_figures import _summary


@pytest.mark.parametrize(
    ("text", "figure", "op", "relative", "bound_at_100"),
    [
        ("fast.ttft_p99_ms <= 800", "fast.ttft_p99_ms", "<=", False, 800),
        ("kv_held_after_finish_s<1", "kv_held_after_finish_s", "<", False, 1),
        ("client_saturated == 0", "client_saturated", "==", False, 0),
        ("server.preemptions >= -2.5", "server.preemptions", ">=", False, -2.5),
        ("x > 2e3", "x", ">", False, 2000),
        ("fast.itl_p99_ms <= 1.2 * baseline", "fast.itl_p99_ms", "<=", True, 120),
        ("a <= baseline", "a", "<=", True, 100),
        ("a <= baseline * 0.5", "a", "<=", True, 50),
        ("a <= baseline + 5", "a", "<=", True, 105),
        ("a >= 0.9*baseline - 10", "a", ">=", True, 80),
        ("my-group.outcome.complete == baseline", "my-group.outcome.complete", "==", True, 100),
    ],
)
def test_gates_parse(text, figure, op, relative, bound_at_100):
    gate = parse_gate(text)
    assert (gate.figure, gate.op, gate.relative) == (figure, op, relative)
    assert gate.bound(100.0) == pytest.approx(bound_at_100)
    assert str(gate) == text


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        ("<= 800", 1, "expected a figure name"),
        ("fast.ttft_p99_ms => 800", 18, "expected a comparison"),
        ("fast.ttft_p99_ms != 800", 18, "expected a comparison"),
        ("fast.ttft_p99_ms <=", 20, "expected a number or 'baseline', got the end"),
        ("fast.ttft_p99_ms <= 1.2 * basline", 27, "expected 'baseline' after '*', got 'basline'"),
        ("fast.ttft_p99_ms <= 1.2 *", 26, "expected 'baseline' after '*'"),
        ("a <= baseline *", 16, "expected a number after '*'"),
        ("a <= 800 ms", 10, "unexpected 'ms'"),
        ("a <= 800 + 5", 10, "unexpected '+'"),
        ("a <= baseline + baseline", 17, "expected a number after '+'"),
        ("a <= 80%", 8, "expected a number, 'baseline'"),
        ("a <= 1e999", 5, "finite"),
    ],
)
def test_gate_syntax_errors_name_the_column(text, column, expected):
    with pytest.raises(GateSyntaxError) as exc:
        parse_gate(text)
    assert exc.value.column == column, str(exc.value)
    assert expected in str(exc.value) and repr(text) in str(exc.value)


def test_evaluation_passes_fails_and_gives_reasons():
    gates = [
        parse_gate(t)
        for t in (
            "a <= 10",
            "a < 5",
            "missing.figure <= 1",
            "nothing <= 1",
            "a <= 1.5 * baseline",
            "b <= baseline + 1",
        )
    ]
    figs = {"a": 8.0, "nothing": None, "b": 3.0}
    results = evaluate_gates(gates, figs, {"a": 6.0}, baseline_source="baseline x.json")
    assert [r.passed for r in results] == [True, False, False, False, True, False]
    assert results[1].measured == 8.0 and results[1].bound == 5.0
    assert results[1].reason == "measured 8, bound < 5"
    assert "not measured" in results[2].reason and "not measured" in results[3].reason
    assert results[4].bound == 9.0 and "1.5 * baseline 6" in results[4].reason
    assert results[5].reason == "baseline x.json has no value for b"


def test_a_gate_on_what_was_not_exercised_is_inconclusive_by_the_policy():
    # A matrix cell none of whose clients left in its phase (MatrixCell.figures): its gates
    # are inconclusive whatever their figure says; a figure not measured elsewhere still fails.
    figs = {
        "decode-fin.exercised": 0.0, "decode-fin.left_in.frontend": 2.0,
        "decode-fin.left_in.queued": 0.0, "decode-fin.zombies": None, "decode-fin.left": 2.0,
        "decode-rst.exercised": 1.0, "decode-rst.zombies": 0.0, "other.ttft_p99_ms": None,
    }  # fmt: skip
    texts = ("decode-fin.zombies == 0", "decode-fin.left >= 1", "decode-rst.zombies == 0",
             "other.ttft_p99_ms <= 1")  # fmt: skip
    gates = [parse_gate(t) for t in texts]
    results = {
        p: evaluate_gates(gates, figs, policy=GatingConfig(inconclusive=p))
        for p in ("warn", "fail", "rerun")
    }
    for policy, passed in (("warn", True), ("fail", False), ("rerun", True)):
        fin, left, rst, other = results[policy]
        assert (fin.verdict, left.verdict) == ("inconclusive", "inconclusive")
        assert fin.passed is left.passed is passed
        assert (rst.verdict, rst.passed) == ("pass", True)
        assert (other.verdict, other.passed) == ("fail", False)
        assert other.reason == "other.ttft_p99_ms was not measured in this run"
    fin, left = results["warn"][:2]
    assert fin.reason == (
        "inconclusive, passes with a warning: decode-fin was not exercised (none of its clients "
        "left in the phase it is named for; they left in frontend 2): decode-fin.zombies was not "
        "measured, about something that did not happen"
    )
    assert "decode-fin.left measured 2" in left.reason
    assert "fails (inconclusive = 'fail')" in results["fail"][0].reason
    # rerun: another repeat while one may come (not final), then a warning.
    again = evaluate_gates(gates, figs, policy=GatingConfig(inconclusive="rerun"), final=False)
    assert not again[0].passed and wants_rerun(again, GatingConfig(inconclusive="rerun"))


def test_relative_gates_without_baseline_fail_unless_skipped_on_purpose():
    gates = [parse_gate("a <= baseline"), parse_gate("a <= 10")]
    failed = evaluate_gates(gates, {"a": 1.0}, None)
    assert [r.passed for r in failed] == [False, True]
    assert "no baseline" in failed[0].reason
    skipped = evaluate_gates(gates, {"a": 1.0}, None, skip_relative=True)
    assert [(r.passed, r.skipped) for r in skipped] == [(True, True), (True, False)]


SCENARIO = """\
name = "g"
gates = [
    "fast.ttft_p99_ms <= 800",
    "server.preemptions <= 50",
    "{gate}",
]

[target]
kind = "sim"

[[groups]]
name = "fast"
users = 1
requests_per_user = 1
"""


def test_unknown_figure_is_rejected_at_load_with_the_valid_names():
    text = SCENARIO.format(gate="fats.itl_p99_ms <= 1.2 * baseline")
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("s.toml"))
    message = str(exc.value)
    assert message.startswith("s.toml:5: field 'gates.2': gate 'fats.itl_p99_ms <= 1.2 * baseline'")
    assert "unknown figure 'fats.itl_p99_ms' (did you mean 'fast.itl_p99_ms'?)" in message
    valid = message.split("valid figures: ")[1].split(", ")
    assert {"fast.ttft_p99_ms", "server.preemptions", "kv_held_after_finish_s"} <= set(valid)
    assert "fast.outcome.client_abort" in valid and "client_saturated" in valid
    # With several groups each group's figures are listed once, not per group.
    slow = '[[groups]]\nname = "slow"\nusers = 1\nrequests_per_user = 1\n'
    two = SCENARIO.format(gate="slwo.ttft_p99_ms <= 1") + slow
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(two, path=Path("s.toml"))
    message = str(exc.value)
    assert "(did you mean 'slow.ttft_p99_ms'?)" in message and "fast.ttft_p99_ms" not in message
    assert "; and <owner>.<name> for owner in fast, slow; name in cut_rst, " in message


def test_gate_syntax_error_names_file_line_gate_and_column():
    text = SCENARIO.format(gate="fast.itl_p99_ms <= 1.2 x baseline")
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("s.toml"))
    assert str(exc.value) == (
        "s.toml:5: field 'gates.2': gate 'fast.itl_p99_ms <= 1.2 x baseline': "
        "unexpected 'x'; expected the end of the gate at column 24"
    )


def test_gates_are_kept_parsed_and_written_back_as_text():
    scenario = parse_scenario(SCENARIO.format(gate="fast.itl_p99_ms <= baseline"), path=Path("s"))
    assert [g.relative for g in scenario.gates] == [False, False, True]
    dumped = scenario.model_dump(mode="json")["gates"]
    assert dumped == [
        "fast.ttft_p99_ms <= 800",
        "server.preemptions <= 50",
        "fast.itl_p99_ms <= baseline",
    ]
    assert json.dumps(dumped)


def test_a_gate_in_a_group_table_is_an_unknown_group_field():
    """TOML puts keys after a table header into that table: gates must come first."""
    text = SCENARIO.split("[target]")[1] + 'gates = ["fast.requests >= 1"]\n'
    with pytest.raises(ScenarioError) as exc:
        parse_scenario('name = "g"\n[target]' + text, path=Path("s.toml"))
    assert str(exc.value) == (
        "s.toml:9: field 'groups.0.gates' (group 'fast'): Extra inputs are not permitted"
    )


def test_overrides_are_merged_before_validation():
    text = SCENARIO.format(gate="fast.requests >= 1")
    scenario = parse_scenario(
        text, path=Path("s"), overrides={"target": {"engine": {"num_blocks": 100}}, "seed": 3}
    )
    assert scenario.target.engine.num_blocks == 100 and scenario.seed == 3  # type: ignore[union-attr]
    with pytest.raises(ScenarioError, match="gates.0"):
        parse_scenario(text, path=Path("s"), overrides={"gates": ["nope <= 1"]})


def _results():
    gates = [parse_gate("fast.ttft_p99_ms <= 20"), parse_gate("fast.ttft_p50_ms <= 800")]
    gates.append(parse_gate("fast.ttft_p90_ms <= baseline"))
    summary = _summary()
    from harness.runfolder import figures

    return summary, evaluate_gates(gates, figures(summary), None, skip_relative=True)


def test_junit_has_one_case_per_gate_with_value_and_bound():
    summary, results = _results()
    unit = junit_run(summary, results, run_dir=Path("/r"), baseline=None)
    root = ET.fromstring(junit_xml([unit]).tostring())
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name") == "zerowindow.s"
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("3", "1", "1")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    assert list(cases) == [g.gate for g in results]
    failure = cases["fast.ttft_p99_ms <= 20"].find("failure")
    assert failure is not None
    assert failure.get("message") == "fast.ttft_p99_ms <= 20: measured 30, bound <= 20"
    assert cases["fast.ttft_p50_ms <= 800"].find("failure") is None
    assert cases["fast.ttft_p90_ms <= baseline"].find("skipped") is not None


def test_junit_reports_a_run_that_did_not_complete():
    summary, results = _results()
    summary = summary.model_copy(update={"status": "failed", "failure": "engine died"})
    unit = junit_run(summary, [], run_dir=Path("/r"), baseline=None)
    root = ET.fromstring(junit_xml([unit]).tostring())
    error = root.find("testsuite/testcase[@name='run']/error")
    assert error is not None and error.get("message") == "run failed: engine died"


def test_step_summary_has_the_gate_table_and_figures():
    summary, results = _results()
    text = step_summary_markdown(summary, results, run_dir=Path("/r"), exit_code=1)
    assert text.startswith("### ❌ zerowindow `s`: 1 of 3 gates failed (exit 1)")
    assert "| ❌ | `fast.ttft_p99_ms <= 20` | 30.00 | <= 20 | measured 30, bound <= 20 |" in text
    assert "| ⏭️ | `fast.ttft_p90_ms <= baseline` |" in text
    assert "| fast | 3 | complete 2, cut_by_peer 1 | 10.0 | 30.0 |" in text
    assert "preemptions 4" in text and "client saturated" in text


def test_missing_or_bad_baseline_is_a_clear_error(tmp_path):
    with pytest.raises(BaselineError, match=r"no baseline at .*x.json.*zerowindow baseline save"):
        load_baseline(tmp_path / "x.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": 1, "figures": {}}')
    with pytest.raises(BaselineError, match=r"bad.json: not a zerowindow baseline: scenario"):
        load_baseline(bad)


def test_baseline_save_refuses_an_incomplete_run_unless_asked(tmp_path):
    from harness.gates._baseline import save_baseline

    failed = _summary().model_copy(update={"status": "failed", "failure": "engine died"})
    (tmp_path / "summary.json").write_text(failed.model_dump_json())
    with pytest.raises(BaselineError, match=r"the run is 'failed' \(engine died\)"):
        save_baseline(tmp_path, tmp_path / "b.json")
    path = save_baseline(tmp_path, tmp_path / "b" / "s.json", allow_incomplete=True)
    baseline = load_baseline(path)
    assert baseline.scenario == "s" and baseline.figures["fast.ttft_p99_ms"] == 30.0
    assert baseline.provenance["status"] == "failed"


def test_a_chains_hops_have_figures_of_their_own() -> None:
    chain = '[proxy]\nkind = "chain"\nhops = [{kind = "traefik"}, {kind = "litellm"}]\n'
    gate = "proxy.hop1.failed_requests == 0"
    scenario = parse_scenario(SCENARIO.format(gate=gate) + chain, path=Path("s.toml"))
    assert [g.figure for g in scenario.gates][-1] == "proxy.hop1.failed_requests"
    # a hop the chain does not have, a figure its kind does not serve: refused by name
    for bad, hint in [
        ("proxy.hop2.rss_peak_bytes <= 1", "did you mean 'proxy.hop1.rss_peak_bytes'?"),
        ("proxy.hop0.failed_requests == 0", "did you mean 'proxy.hop1.failed_requests'?"),
    ]:
        with pytest.raises(ScenarioError) as exc:
            parse_scenario(SCENARIO.format(gate=bad) + chain, path=Path("s.toml"))
        assert hint in str(exc.value), str(exc.value)
    # without a proxy there is no hop: the hop figures are unknown
    with pytest.raises(ScenarioError, match="unknown figure 'proxy.hop0.rss_peak_bytes'"):
        parse_scenario(SCENARIO.format(gate="proxy.hop0.rss_peak_bytes <= 1"), path=Path("s"))
