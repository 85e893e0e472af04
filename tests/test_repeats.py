"""Repeats and noise-aware gates end to end on the engine emulator: one trial of the A/B and A/A
experiments of docs/gates.md through the CLI (`run --repeats`, `baseline save`, gated runs),
and the rerun policy. The 20-trial counts are `zerowindow bench gates` (bench/RESULTS.md)."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pandas as pd
import pytest

from harness.gates import load_baseline
from tests.conftest import REPO, only_run_dir, run_cli

GATES = REPO / "scenarios" / "gates"


@pytest.fixture(scope="module")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A baseline saved from 2 repeats of ab-baseline.toml."""
    out = tmp_path_factory.mktemp("ab")
    res = run_cli(
        "run", str(GATES / "ab-baseline.toml"), "--repeats", "2", "--no-baseline",
        "--out", str(out / "base"), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = only_run_dir(out / "base")
    assert sorted(p.name for p in run_dir.iterdir() if p.is_dir()) == ["r1", "r2"]
    record = json.loads((run_dir / "repeats.json").read_text())
    assert record["runs"] == ["r1", "r2"] and record["repeats"] == 2
    itl = record["figures"]["fast.itl_p50_ms"]
    assert itl["method"] == "bootstrap" and itl["low"] <= itl["value"] <= itl["high"]
    assert len(itl["per_repeat"]) == 2
    assert "fast.ttft_p50_ms" in res.stdout and "2 repeats" in res.stdout
    saved = run_cli("baseline", "save", str(run_dir), "--to", str(out / "base.json"))
    assert saved.returncode == 0, saved.stderr
    return out / "base.json"


def test_a_baseline_keeps_every_repeat_and_the_samples(baseline: Path) -> None:
    kept = load_baseline(baseline)
    assert kept.format == 2 and len(kept.repeats) == 2
    assert kept.provenance["repeats"] == 2
    samples = pd.read_parquet(baseline.parent / str(kept.samples_file))
    assert set(samples["repeat"]) == {0, 1}
    assert {"fast.ttft_ms", "fast.itl_ms", "fast.e2e_ms"} <= set(samples["sample"])
    # 8 users x 3 requests per repeat, each with a TTFT.
    assert (samples["sample"] == "fast.ttft_ms").sum() == 2 * 24


def test_a_slower_engine_fails_with_intervals_effect_and_p_value(
    baseline: Path, tmp_path: Path
) -> None:
    res = run_cli(
        "run", str(GATES / "ab-slower.toml"), "--repeats", "2", "--baseline", str(baseline),
        "--out", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    run_dir = only_run_dir(tmp_path)
    cases = {c.get("name"): c for c in ET.parse(run_dir / "junit.xml").iter("testcase")}
    failure = cases["fast.itl_p50_ms <= 1.1 * baseline"].find("failure")
    assert failure is not None
    message = failure.get("message", "")
    # The step time is 20 % longer: ITL is ~1.2x the baseline's, far outside the 1.1x bound.
    effect = re.search(r"effect x([\d.]+) \[([\d.]+), ([\d.]+)\]", message)
    assert effect is not None, message
    assert float(effect[1]) == pytest.approx(1.2, abs=0.05) and float(effect[2]) > 1.1
    assert "p = " in message
    assert cases["fast.itl_ms ~ baseline within 10%"].find("failure") is not None
    gates = json.loads((run_dir / "gates.json").read_text())["gates"]
    itl = next(g for g in gates if g["gate"].startswith("fast.itl_p50_ms"))
    assert itl["verdict"] == "fail" and itl["effect_low"] > 1.1


def test_the_same_settings_do_not_fail(baseline: Path, tmp_path: Path) -> None:
    res = run_cli(
        "run", str(GATES / "ab-baseline.toml"), "--repeats", "2", "--baseline", str(baseline),
        "--out", str(tmp_path), "--no-progress",
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    gates = json.loads((only_run_dir(tmp_path) / "gates.json").read_text())["gates"]
    assert {g["verdict"] for g in gates} <= {"pass", "inconclusive"}


def test_the_rerun_policy_adds_repeats_while_a_gate_is_inconclusive(
    baseline: Path, tmp_path: Path
) -> None:
    # A bound at exactly the baseline: the same settings are inconclusive, or now and then
    # decided either way, after 2 repeats.
    text = (GATES / "ab-baseline.toml").read_text()
    text = text.replace('inconclusive = "warn"', 'inconclusive = "rerun"\nmax_reruns = 1')
    text = text.replace('"fast.ttft_p50_ms <= 1.1 * baseline"', '"fast.ttft_p50_ms <= baseline"')
    scenario = tmp_path / "rerun.toml"
    scenario.write_text(text)
    res = run_cli(
        "run", str(scenario), "--repeats", "2", "--baseline", str(baseline),
        "--out", str(tmp_path / "out"), "--no-progress",
    )  # fmt: skip
    run_dir = only_run_dir(tmp_path / "out")
    record = json.loads((run_dir / "repeats.json").read_text())
    gate = next(g for g in record["gates"] if g["gate"] == "fast.ttft_p50_ms <= baseline")
    if len(record["runs"]) == 3:  # inconclusive after 2: one rerun, then judged as final
        assert gate["verdict"] in ("inconclusive", "pass", "fail")
        if gate["verdict"] == "inconclusive":
            assert gate["passed"] and "passes with a warning" in gate["reason"]
    else:  # decided after 2 repeats: no rerun
        assert record["runs"] == ["r1", "r2"] and gate["verdict"] in ("pass", "fail")
    assert res.returncode == (0 if all(g["passed"] for g in record["gates"]) else 1)
