"""The disconnect matrix never passes vacuously: a cell none of whose clients left in its
phase is reported as not exercised, with the phase they reached, and its gates are
inconclusive under the scenario's ``[gating] inconclusive`` policy.

One short run on the engine emulator with one batch slot (``max_num_seqs = 1``): a ``hog``
request of ~3.4 s takes the slot just before the ``decode-fin`` window. That cell's clients
leave by the clock, 0.3 s after their send, as the matrix's decode cells did before they
waited for their first token (or as a load process whose clock is not the engine's would):
the engine still had them queued, so the cell is not exercised. The ``decode-rst`` clients
are sent while the hog still runs (~1.2 s before its end: a load process started late on a
busy machine still finds it running) and leave as the matrix sends them, 0.3 s after their
first token: they wait behind it, get scheduled one after the other, and leave mid-decode.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from harness.gates import evaluate_gates
from harness.lifecycle import RunResult, run_scenario
from harness.lifecycle._suite import _cell_line
from harness.outputs import abort_text
from harness.outputs._matrix import print_matrix
from harness.runfolder import MatrixCell, RunSummary, figures
from harness.scenario import GatingConfig, parse_scenario
from loadgen import Leave

SCENARIO = """
name = "matrix-exercised"
max_duration_s = 30
cooldown_s = 0.5
gates = [
    "decode-fin.zombies == 0",
    "decode-fin.leave_to_abort_max_ms <= 2000",
    "decode-rst.zombies == 0",
    "decode-rst.leave_to_abort_max_ms <= 2000",
]

[matrix]
phases = ["decode"]
leaves = ["fin", "rst"]
repeats = 2
cell_s = 2
tail_s = 1
max_tokens = 400
decode_leave_after_s = 0.3
victim_rps = 1
victim_max_tokens = 4

[[groups]]
name = "hog"
users = 1
requests_per_user = 1
start_after_s = 1.8
max_tokens = 800

[target]
kind = "sim"

[target.engine]
max_num_seqs = 1
step_fixed_ms = 4.0
decode_ms_per_seq = 0.3
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    scenario = parse_scenario(SCENARIO, path=Path("matrix-exercised.toml"))
    by_clock = Leave(how="fin", after_s=0.3)
    groups = [
        g.model_copy(update={"action": by_clock}) if g.name == "decode-fin" else g
        for g in scenario.groups
    ]
    scenario = scenario.model_copy(update={"groups": groups})
    return run_scenario(scenario, out_root=tmp_path_factory.mktemp("matrix-exercised"))


def _cells(summary: RunSummary) -> dict[str, MatrixCell]:
    return {c.cell: c for c in summary.matrix}


def test_a_cell_whose_clients_stayed_queued_is_not_exercised(run: RunResult) -> None:
    cell = _cells(run.summary)["decode-fin"]
    assert cell.left == cell.clients == 2
    assert cell.phase_source == "engine" and cell.phases == {"queued": 2}
    assert cell.exercised is False and cell.in_phase == 0 and cell.reached_phase == "queued"
    # What did not happen is not measured: no zombie count of 0 for clients never decoded.
    assert cell.zombies is None and cell.leave_to_abort_max_ms is None
    assert abort_text(cell) == "not exercised: queued 2 (0 of 2 left in decode)"
    assert _cell_line(cell).startswith(
        "decode-fin: not exercised: queued 2 (0 of 2 left in decode): its gates are inconclusive"
    )
    console = Console(record=True, width=200)
    print_matrix(run.summary.matrix, console)
    assert "its gates are inconclusive): decode-fin" in console.export_text()


def test_its_gates_are_inconclusive_under_the_policy(run: RunResult) -> None:
    gates = parse_scenario(SCENARIO, path=Path("m.toml")).gates
    warned = evaluate_gates(gates, figures(run.summary), policy=GatingConfig(inconclusive="warn"))
    failed = evaluate_gates(gates, figures(run.summary), policy=GatingConfig(inconclusive="fail"))
    for results, passes in ((warned, True), (failed, False)):
        fin = [g for g in results if g.figure.startswith("decode-fin.")]
        assert [g.verdict for g in fin] == ["inconclusive", "inconclusive"]
        assert all(g.passed is passes for g in fin), fin
        assert "decode-fin was not exercised" in fin[0].reason
        assert "they left in queued 2" in fin[0].reason
        rst = [g for g in results if g.figure.startswith("decode-rst.")]
        assert [g.verdict for g in rst] == ["pass", "pass"], rst
    assert "passes with a warning" in warned[0].reason
    assert "fails (inconclusive = 'fail')" in failed[0].reason
    # The run's own gates (gates.json, the exit code) read the same figures.
    own = [g.verdict for g in run.gates if g.figure.startswith("decode-fin.")]
    assert own == ["inconclusive", "inconclusive"] and run.exit_code == 0, run.gates


def test_decode_clients_behind_a_busy_engine_leave_mid_decode(run: RunResult) -> None:
    cell = _cells(run.summary)["decode-rst"]
    assert cell.exercised is True and cell.in_phase == 2 and cell.phases == {"decode": 2}
    assert cell.zombies == 0 and cell.aborted == 2
    requests = pd.read_parquet(run.run_dir / "requests.parquet")
    rst = requests[requests["group"] == "decode-rst"]
    # Each waited behind the hog for its first token, then 0.3 s more.
    waited = rst["t_action"] - rst["t_first_token"]
    assert ((waited > 0.25) & (waited < 0.6)).all(), rst[["t_send", "t_first_token", "t_action"]]
    assert (rst["t_first_token"] - rst["t_send"] > 0.2).all()  # it did queue
