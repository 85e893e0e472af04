"""The pytest plugin: a test suite of its own (run by pytester in a fresh pytest process) uses
the ``zerowindow_run`` fixture on a tiny engine-emulator scenario."""

from __future__ import annotations

import os
import tomllib

import pytest

from tests.conftest import REPO

pytest_plugins = ["pytester"]

SCENARIO = """\
name = "plugin"
max_duration_s = 30
cooldown_s = 0.5
gates = ["fast.outcome.complete == 2"]

[target]
kind = "sim"

[[groups]]
name = "fast"
users = 1
requests_per_user = 2
max_tokens = 16
"""

TESTS = """\
from pathlib import Path

from harness import RunSummary


def test_typed_summary(zerowindow_run):
    result = zerowindow_run("plugin.toml", overrides={"target": {"engine": {"num_blocks": 100}}})
    assert result.exit_code == 0
    assert isinstance(result.summary, RunSummary)
    assert result.summary.groups[0].requests == 2
    assert result.figures["fast.outcome.complete"] == 2.0
    assert [g.passed for g in result.gates] == [True]
    assert (result.run_dir / "junit.xml").exists()
    assert Path(result.run_dir).parent.parent == Path(OUT)


def test_failing_gate_fails_the_test(zerowindow_run):
    zerowindow_run("plugin.toml", overrides={"gates": ["fast.ttft_p50_ms < 0.001"]}, check=True)


def test_every_configuration_runs_its_repeats(zerowindow_run):
    proxies = [{"name": "none", "kind": "none"}, {"name": "egress", "kind": "egress"}]
    result = zerowindow_run("plugin.toml", overrides={"proxies": proxies}, repeats=2)
    assert result.exit_code == 0, result.failure
    assert sorted(result.runs) == ["egress/r1", "egress/r2", "none/r1", "none/r2"]
    for name, arm in result.arms.items():
        assert [r.summary.groups[0].requests for r in arm.runs] == [2, 2], name
        ttft = arm.estimates["fast.ttft_p50_ms"]
        assert ttft["low"] <= ttft["value"] <= ttft["high"], name
        assert [g.verdict for g in arm.gates] == ["pass"], name
    assert result.comparison is not None and result.comparison.repeats == {"none": 2, "egress": 2}
"""


def test_pyproject_declares_the_plugin_entry_point():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["entry-points"]["pytest11"] == {"zerowindow": "harness.pytest_plugin"}


def test_fixture_runs_a_scenario_and_returns_its_summary(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The entry point as an installed distribution declares it (whether or not this
    # environment's install already has it): pytest must load the plugin from it unasked.
    site = pytester.path / "site"
    dist = site / "zerowindow_plugin_test-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zerowindow-plugin-test\n")
    (dist / "entry_points.txt").write_text("[pytest11]\nzerowindow = harness.pytest_plugin\n")
    pythonpath = os.environ.get("PYTHONPATH")
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(p for p in (str(site), str(REPO), pythonpath) if p)
    )
    out = pytester.path / "runs"
    pytester.makefile(".toml", plugin=SCENARIO)
    pytester.makepyfile(test_slo=f"OUT = {str(out)!r}\n" + TESTS)
    result = pytester.runpytest_subprocess(
        "--zerowindow-out", str(out), "-p", "no:cacheprovider", timeout=300
    )
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*zerowindow run */plugin/* exited 1",
            "*gate 'fast.ttft_p50_ms < 0.001' failed: measured *, bound < 0.001",
        ]
    )
    assert len(list(out.glob("plugin/*/summary.json"))) == 2
    assert len(list(out.glob("plugin/*/plan.json"))) == 1  # the comparison's folder
