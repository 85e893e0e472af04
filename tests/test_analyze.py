"""``zerowindow analyze``: analysis is a pure function of a run folder.

``tests/data/sim-coupled-before-analyze/`` is a run folder written by ``zerowindow run
scenarios/sim-coupled.toml`` before the harness was rearranged by role (commit 090c240; its
report and logs left out). Analysing it again must reproduce its ``summary.json`` and tables.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd

from harness import Baseline, analyze, read_facts, reanalyze
from harness.lifecycle._conclude import conclude
from tests.conftest import REPO, run_cli

BEFORE = REPO / "tests" / "data" / "sim-coupled-before-analyze"


def _copy(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(BEFORE, run_dir)
    return run_dir


def _summary_text(run_dir: Path, *, recorded_in: Path) -> str:
    """summary.json with the folder's own path (saturation files name it) made neutral."""
    text = (run_dir / "summary.json").read_text()
    return text.replace(str(recorded_in), "<run>")


def _assert_keeps(new: object, old: object, where: str = "summary") -> None:
    """``new`` holds every value of ``old`` (strings: as their beginning)."""
    if isinstance(old, dict):
        assert isinstance(new, dict), where
        for key, value in old.items():
            assert key in new, f"{where}.{key} missing"
            _assert_keeps(new[key], value, f"{where}.{key}")
    elif isinstance(old, list):
        assert isinstance(new, list) and len(new) == len(old), where
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            _assert_keeps(a, b, f"{where}[{i}]")
    elif isinstance(old, str):
        assert isinstance(new, str) and new.startswith(old), f"{where}: {new!r} vs {old!r}"
    else:
        assert new == old, f"{where}: {new!r} != {old!r}"


def test_analysis_reads_and_never_writes(tmp_path):
    run_dir = _copy(tmp_path)
    before = {p.name: p.read_bytes() for p in run_dir.iterdir()}
    analysis = analyze(run_dir)
    assert {p.name: p.read_bytes() for p in run_dir.iterdir()} == before
    assert analysis.summary.verdicts["kv_held_by_undelivered_streams"]["status"] == "held"


def test_analyze_reproduces_a_folder_made_before_the_change(tmp_path):
    run_dir = _copy(tmp_path)
    old_summary = json.loads((BEFORE / "summary.json").read_text())
    old_requests = pd.read_parquet(BEFORE / "requests.parquet")
    old_chunks = pd.read_parquet(BEFORE / "chunks.parquet")
    recorded = Path(old_summary["client_saturation"]["processes"][0]["path"]).parent
    result = reanalyze(run_dir)
    assert result.exit_code == 0 and result.summary.status == "complete"
    # Every figure the old analysis wrote is the same; fields added since are extra, and the
    # verdict line says that such a folder is scrape-only.
    _assert_keeps(
        json.loads(_summary_text(run_dir, recorded_in=run_dir)),
        json.loads(_summary_text(BEFORE, recorded_in=recorded)),
    )
    new_requests = pd.read_parquet(run_dir / "requests.parquet")
    pd.testing.assert_frame_equal(new_requests[old_requests.columns], old_requests)
    pd.testing.assert_frame_equal(pd.read_parquet(run_dir / "chunks.parquet"), old_chunks)
    # run.json now keeps every fact analysis needs; a second analysis reads only those.
    info = json.loads((run_dir / "run.json").read_text())
    assert info["duration_s"] == old_summary["duration_s"] and info["exit_code"] == 0
    first = _summary_text(run_dir, recorded_in=run_dir)
    (run_dir / "summary.json").unlink()
    assert read_facts(run_dir).duration_s == old_summary["duration_s"]
    reanalyze(run_dir)
    assert _summary_text(run_dir, recorded_in=run_dir) == first


def test_analyze_command(tmp_path):
    run_dir = _copy(tmp_path)
    done = run_cli("analyze", str(run_dir), timeout=300)
    assert done.returncode == 0, done.stderr
    assert "KV held by undelivered streams: HELD" in done.stdout
    assert (run_dir / "report.html").exists() and (run_dir / "junit.xml").exists()
    missing = run_cli("analyze", str(tmp_path / "nowhere"), timeout=120)
    assert missing.returncode == 2
    assert "run.json: missing" in missing.stderr and "Traceback" not in missing.stderr


def test_relative_gates_keep_the_baseline_the_run_used(tmp_path):
    """A run gated against a baseline is gated against the same baseline when analysed again
    (its copy baseline.json travels with the folder), even where the baseline file is gone;
    --no-baseline skips its relative gates for that analysis only."""
    run_dir = _copy(tmp_path)
    info = json.loads((run_dir / "run.json").read_text())
    info["scenario"]["gates"] = ["fast.ttft_p99_ms <= 0.01 * baseline"]
    (run_dir / "run.json").write_text(json.dumps(info))
    figures = json.loads((BEFORE / "summary.json").read_text())["groups"][0]
    path = tmp_path / "baseline.json"
    base = Baseline(scenario="sim-coupled", figures={"fast.ttft_p99_ms": figures["ttft_p99_ms"]})
    path.write_text(base.model_dump_json())
    pristine = tmp_path / "pristine"
    shutil.copytree(run_dir, pristine)
    # as `zerowindow run` concludes: gated against the file, which is copied into the folder
    assert conclude(run_dir, read_facts(run_dir), info, setup_failed=False,
                    baseline=(path, base)).exit_code == 1  # fmt: skip
    path.unlink()
    again = reanalyze(run_dir)
    assert again.exit_code == 1 and again.baseline == run_dir / "baseline.json"
    assert not again.gates[0].passed and not again.gates[0].skipped
    done = run_cli("analyze", str(run_dir), timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    skipped = reanalyze(run_dir, use_baseline=False)
    assert skipped.exit_code == 0 and skipped.gates[0].skipped
    assert reanalyze(run_dir).exit_code == 1  # the copy is still there
    # a run that skipped them on purpose (`run --no-baseline`) is analysed the same way
    conclude(pristine, read_facts(pristine), info, setup_failed=False, skip_relative=True)
    assert reanalyze(pristine).gates[0].skipped


def _as_if_killed(run_dir: Path, harness: dict[str, object]) -> None:
    """Make ``run_dir``'s run.json what a run whose harness was killed leaves: status running,
    no end, the harness process it names."""
    info = json.loads((run_dir / "run.json").read_text())
    for key in ("duration_s", "ended_utc", "exit_code", "failure", "gates"):
        info.pop(key, None)
    info.update(status="running", harness=harness)
    (run_dir / "run.json").write_text(json.dumps(info))
    for name in ("summary.json", "requests.parquet", "chunks.parquet", "gates.json"):
        (run_dir / name).unlink(missing_ok=True)


def test_a_killed_runs_folder_is_analysed_as_killed(tmp_path):
    import os

    from netem import process_start_ticks
    from zwcore import RunFolderError

    run_dir = _copy(tmp_path)
    info = json.loads((run_dir / "run.json").read_text())
    start = info["clock"]["monotonic_at_start_s"]
    ends = [
        json.loads(line)["t_end"]
        for path in run_dir.glob("records-*.jsonl")
        for line in path.read_text().splitlines()
    ]
    # While the harness named in run.json runs (here: this process), the run is not over.
    me = {"pid": os.getpid(), "start_ticks": process_start_ticks(os.getpid())}
    _as_if_killed(run_dir, me)
    try:
        read_facts(run_dir)
    except RunFolderError as exc:
        assert "still running" in str(exc) and str(os.getpid()) in str(exc)
    else:
        raise AssertionError("a run whose harness still runs was analysed")
    # Once it is gone (same pid, another start time), the records are the run.
    _as_if_killed(run_dir, {**me, "start_ticks": -1})
    done = run_cli("analyze", str(run_dir))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "killed" and info["exit_code"] == 0
    assert info["duration_s"] == max(ends) - start
    assert f"stop {max(ends) - start:.1f} s after the start" in info["failure"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "killed"
    assert len(pd.read_parquet(run_dir / "requests.parquet")) == len(ends)
