"""The history of runs (harness.history): the DuckDB store, change points, the history gate,
and ``zerowindow history add|show|check`` on the session's shared emulator runs."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime, timedelta
from pathlib import Path

import duckdb
import numpy as np
import pytest

from harness.gates import evaluate_gates
from harness.history import (
    Entry,
    HistoryStore,
    folder_entries,
    judge_trend,
    past_of,
    worse_direction,
)
from harness.lifecycle import RunResult
from harness.scenario import GateSyntaxError, parse_gate
from tests._chromium import needs_chromium
from tests._sim_runs import sim_runs
from tests.conftest import run_cli
from zwcore import HistoryError


def _series(seed: int, n: int = 60, step_at: int | None = None, step: float = 1.15) -> list[float]:
    """n values around 100 with 3 % noise, multiplied by ``step`` from run ``step_at`` on."""
    values = 100 + np.random.default_rng(seed).normal(0, 3, n)
    if step_at is not None:
        values[step_at - 1 :] *= step
    return [float(v) for v in values]


def test_history_gate_syntax():
    gate = parse_gate("fast.ttft_p99_ms ~ history")
    assert gate.history and not gate.distribution and not gate.relative
    assert gate.within == pytest.approx(0.10)
    assert parse_gate("fast.ttft_p99_ms ~ history within 5%").within == pytest.approx(0.05)
    with pytest.raises(GateSyntaxError, match="after 'history'"):
        parse_gate("fast.ttft_p99_ms ~ history by 5%")


def test_which_way_is_worse():
    assert worse_direction("fast.ttft_p99_ms") == "higher"
    assert worse_direction("kv_held_after_finish_s") == "higher"
    assert worse_direction("slow.outcome.client_abort") == "higher"
    assert worse_direction("fast.output_tokens_per_s") == "lower"
    assert worse_direction("fast.outcome.complete") == "lower"
    assert worse_direction("fast.output_tokens") == "either"


@pytest.mark.parametrize("seed", range(5))
def test_a_step_is_found_where_it_happened_and_an_a_a_series_passes(seed):
    assert not judge_trend(_series(seed), "fast.ttft_p99_ms", within=0.10).failed
    stepped = _series(seed, step_at=31)
    trend = judge_trend(stepped, "fast.ttft_p99_ms", within=0.10)
    assert trend.failed and "run 31" in trend.reason, trend.reason
    assert any(abs(p.index + 1 - 31) <= 1 for p in trend.points)
    point = next(p for p in trend.points if abs(p.index + 1 - 31) <= 1)
    assert point.low < 0.15 < point.high or abs(point.change - 0.15) < 0.05
    assert point.p_value < 0.001
    # Decided by the first runs after the step: one run alone cannot tell a step from an
    # outlier, two can; fails at run 32 or 33.
    first = next(n for n in range(6, 61) if judge_trend(stepped[:n], "x_ms", within=0.10).failed)
    assert 32 <= first <= 33
    outlier = _series(seed)[:40] + [200.0] + _series(seed)[41:]  # one run 2x slower, then not
    assert not any(judge_trend(outlier[:n], "x_ms", within=0.10).failed for n in range(6, 61))


def test_an_improvement_or_a_change_within_the_tolerance_passes():
    faster = [v / 1.3 for v in _series(1, step_at=31, step=1.0)]
    faster = _series(1)[:30] + faster[30:]
    assert not judge_trend(faster, "fast.ttft_p99_ms", within=0.10).failed
    small = _series(1, step_at=31, step=1.05)
    assert not judge_trend(small, "fast.ttft_p99_ms", within=0.10).failed
    assert judge_trend(small, "fast.ttft_p99_ms", within=0.02).failed
    recovering = _series(4, step_at=31, step=1.2)
    recovering[44:] = [v * 0.97 for v in recovering[44:]]  # a small recovery is no fix
    trend = judge_trend(recovering, "fast.ttft_p99_ms", within=0.10)
    assert trend.failed and "run 31" in trend.reason, trend.reason
    lower = _series(2, step_at=31, step=0.8)  # throughput falling by 20 %
    assert judge_trend(lower, "fast.output_tokens_per_s", within=0.10).failed
    assert not judge_trend(_series(3)[:5], "x_ms", within=0.1).points  # too few runs


def test_a_file_that_is_no_history_is_refused_and_left_as_it_was(tmp_path):
    junk = tmp_path / "junk.duckdb"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(HistoryError, match="not a history file"):
        HistoryStore(junk)
    assert junk.read_bytes() == b"not a database at all" * 100
    foreign = tmp_path / "foreign.duckdb"
    with duckdb.connect(str(foreign)) as con:
        con.execute("CREATE TABLE orders (id INTEGER)")
    before = foreign.read_bytes()
    with pytest.raises(HistoryError, match=r"not a zerowindow history \(tables: orders\)"):
        HistoryStore(foreign)
    assert foreign.read_bytes() == before
    with pytest.raises(HistoryError, match="no history here"):
        HistoryStore(tmp_path / "missing.duckdb", read_only=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return sim_runs(tmp_path_factory)


def _out_root(runs: dict[str, RunResult]) -> Path:
    return runs["on_delivery"].run_dir.parent.parent


def test_every_run_adds_itself_and_adding_again_changes_nothing(runs, tmp_path):
    history = _out_root(runs) / "history.duckdb"
    for result in runs.values():
        info = json.loads((result.run_dir / "run.json").read_text())
        assert info["history"] == str(history) and info["history_added"] == 1
    with HistoryStore(history, read_only=True) as store:
        entries = store.entries("sim-coupled")
    assert len(entries) == 2 and set(entries["status"]) == {"complete"}
    assert entries["series"].nunique() == 1  # same machine, engine, model and configuration
    proc = run_cli("history", "add", str(_out_root(runs)), "--history", str(history))
    assert proc.returncode == 0, proc.stderr
    assert "0 entries added" in proc.stdout and "2 already there" in proc.stdout
    copy = tmp_path / "copy.duckdb"
    proc = run_cli("history", "add", *(str(r.run_dir) for r in runs.values()), "--history",
                   str(copy))  # fmt: skip
    assert "2 entries added" in proc.stdout, proc.stdout + proc.stderr
    with HistoryStore(copy, read_only=True) as store:
        assert set(store.entries("sim-coupled")["entry_id"]) == set(entries["entry_id"])


def _with_past(entry: Entry, store: Path, values: list[float], figure: str) -> None:
    """Add ``values`` of ``figure`` as runs of ``entry``'s series before it, an hour apart."""
    start = datetime.fromisoformat(entry.started_utc)
    past = [
        dataclasses.replace(
            entry,
            entry_id=f"past-{i}",
            figures={figure: (v, None, None)},
            gates=[],
            started_utc=(start - timedelta(hours=len(values) - i)).isoformat(),
        )  # fmt: skip
        for i, v in enumerate(values)
    ]
    with HistoryStore(store) as s:
        s.add(past)


def test_a_history_gate_reads_the_runs_of_its_series_before_it(runs, tmp_path):
    folder = runs["on_finish"].run_dir
    (entry,) = folder_entries(folder)
    figure = "fast.ttft_p99_ms"
    measured = entry.figures[figure][0]
    assert measured is not None
    gate = parse_gate(f"{figure} ~ history")
    for name, factor, failed in (("aa", 1.0, False), ("step", 0.6, True)):
        store = tmp_path / f"{name}.duckdb"
        # Ten runs at the factor, then two like this run (the step, when the factor is not 1).
        scale = [factor] * 10 + [1.0, 1.0]
        noisy = [measured * f * (1 + 0.02 * np.sin(i)) for i, f in enumerate(scale)]
        _with_past(entry, store, noisy, figure)
        past = past_of(store, entry.series, entry.entry_id)
        assert past is not None and len(past(figure)) == 12
        (result,) = evaluate_gates([gate], {figure: measured}, past=past)
        assert result.passed is not failed, result.reason
        if failed:
            assert "run 11" in result.reason and "beyond 10%" in result.reason
    (skipped,) = evaluate_gates([gate], {figure: measured}, past=None)
    assert skipped.skipped and skipped.passed


def test_history_show_lists_the_runs_with_their_provenance(runs, tmp_path):
    history = _out_root(runs) / "history.duckdb"
    proc = run_cli("history", "show", "sim-coupled", "--history", str(history), "--out",
                   str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 run(s) in the history" in proc.stdout
    assert "sim 0.1.0" in proc.stdout and "fast.ttft_p99_ms" in proc.stdout
    assert (tmp_path / "history.html").is_file()
    missing = run_cli("history", "show", "nope", "--history", str(history))
    assert missing.returncode == 2 and "scenarios: sim-coupled" in missing.stderr
    check = run_cli("history", "check", "sim-coupled", "--history", str(history), "--figure",
                    "fast.ttft_p99_ms", "--junit", str(tmp_path / "h.xml"))  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "a change point needs at least" in check.stdout
    assert "<testsuite" in (tmp_path / "h.xml").read_text()


@needs_chromium
def test_history_page_opens_in_chromium_with_its_plots(runs, tmp_path):
    from tests._chromium import PLOT_CHECK, open_page

    history = _out_root(runs) / "history.duckdb"
    proc = run_cli("history", "show", "sim-coupled", "--history", str(history), "--out",
                   str(tmp_path), "--figure", "fast.*_p99_ms")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = open_page((tmp_path / "history.html").resolve().as_uri(), PLOT_CHECK)
    (tmp_path / "history.png").write_bytes(page.screenshot)
    assert page.console_errors == [] and page.external_requests == []
    assert len(page.value) == 3, page.value  # fast.ttft_p99_ms, itl_p99_ms, inter_chunk_p99_ms
    for plot in page.value.values():
        assert any(sp["points"] >= 2 for sp in plot["subplots"].values()), plot
