"""The history's change points on real runs, and what the history costs at 1,000 runs.

Detection: two series of ``--runs`` short runs of one scenario on the engine emulator, each
added to its own history as ``zerowindow run`` adds it: an A/A series (nothing changes), and
a step series whose engine is 15 % slower per step (``step_fixed_ms``,
``decode_ms_per_seq``, ``prefill_ms_per_token`` x 1.15) from run ``--step-at`` on. After every
run, each watched figure's history gate (``~ history within 10%``) is judged as the run's own
gate would be; reported: the change points of the whole series, and the first run whose gate
fails.

Cost: a store holding ``--cost-runs`` entries (copies of one real run's entry, every figure
kept), then the time to add one more run, and of ``zerowindow history show`` and ``history
check`` on it.

    python bench/_history_bench.py --runs 60 --step-at 31
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from harness.history import HistoryStore, folder_entries, judge_trend, trends
from harness.lifecycle import run_scenario
from harness.outputs import write_history_page
from harness.scenario import parse_scenario

FIGURES = ("fast.itl_p50_ms", "fast.ttft_p50_ms", "fast.output_tokens_per_s", "duration_s")
SCENARIO = """
name = "{name}"
max_duration_s = 60
cooldown_s = 0.5
[target]
kind = "sim"
[target.engine]
step_fixed_ms = {step_fixed_ms}
decode_ms_per_seq = {decode_ms_per_seq}
prefill_ms_per_token = {prefill_ms_per_token}
eos_probability = 0
[netem]
measure = false
[[groups]]
name = "fast"
users = 4
requests_per_user = 3
max_tokens = 100
"""


def _scenario(name: str, slower: float) -> Any:
    text = SCENARIO.format(
        name=name, step_fixed_ms=4.0 * slower, decode_ms_per_seq=0.3 * slower,
        prefill_ms_per_token=0.02 * slower,
    )  # fmt: skip
    return parse_scenario(text, path=Path(f"{name}.toml"))


def series(name: str, runs: int, step_at: int | None, out: Path) -> dict[str, Any]:
    """One series of real runs (module docstring); returns its figures, change points and
    the first failing run per figure."""
    history = out / f"{name}.duckdb"
    values: dict[str, list[float]] = {f: [] for f in FIGURES}
    first_fail: dict[str, int | None] = dict.fromkeys(FIGURES)
    for i in range(1, runs + 1):
        slower = 1.15 if step_at is not None and i >= step_at else 1.0
        result = run_scenario(_scenario(name, slower), out_root=out, history=history)
        for figure in FIGURES:
            value = result.figures.get(figure)
            if value is None:
                continue
            values[figure].append(value)
            trend = judge_trend(values[figure], figure, within=0.10)
            if trend.failed and first_fail[figure] is None:
                first_fail[figure] = i
        print(f"{name} run {i}: " + ", ".join(f"{f} {values[f][-1]:.4g}" for f in FIGURES),
              flush=True)  # fmt: skip
    with HistoryStore(history, read_only=True) as store:
        found = trends(store, name, figures=FIGURES)
    return {
        "runs": runs,
        "step_at": step_at,
        "first_fail": first_fail,
        "change_points": {t.figure: [p.as_dict() for p in t.points] for t in found},
        "values": values,
    }


def cost(out: Path, runs: int) -> dict[str, float]:
    """Seconds to add one run to a store of ``runs`` entries, and to show and check it."""
    result = run_scenario(_scenario("history-cost", 1.0), out_root=out, use_history=False)
    (entry,) = folder_entries(result.run_dir)
    store_path = out / "cost.duckdb"
    start = datetime.fromisoformat(entry.started_utc)
    copies = [
        dataclasses.replace(entry, entry_id=f"copy-{i}",
                            started_utc=(start - timedelta(hours=runs - i)).isoformat())
        for i in range(runs)
    ]  # fmt: skip
    t0 = time.perf_counter()
    with HistoryStore(store_path) as store:
        store.add(copies)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with HistoryStore(store_path) as store:
        store.add([entry])
    add_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    with HistoryStore(store_path, read_only=True) as store:
        entries = store.entries("history-cost")
        found = trends(store, "history-cost")
    write_history_page(out, "history-cost", entries, found, max_pvalue=0.001)
    show_s = time.perf_counter() - t0
    return {
        "entries": runs + 1,
        "figures_per_entry": len(entry.figures),
        "fill_s": fill_s,
        "add_one_s": add_s,
        "show_s": show_s,
        "show_figures": len(found),
        "file_bytes": store_path.stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--step-at", type=int, default=31)
    parser.add_argument("--cost-runs", type=int, default=1000)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="zw-history-bench-") as tmp:
        out = Path(tmp)
        data = {
            "cost": cost(out, args.cost_runs),
            "aa": series("history-aa", args.runs, None, out),
            "step": series("history-step", args.runs, args.step_at, out),
        }
    text = json.dumps(data, indent=1)
    if args.json:
        args.json.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
