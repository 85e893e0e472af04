"""The disconnect matrix's cells (``harness.scenario._matrix``) from a run's requests.

Each cell's clients left in its window; what the engine did with them comes from the leave
columns (``harness.analysis._leaves``). The victims' requests sent in a window say what the
cell cost the others: their TTFT p50/p99 and per-token ITL p99, and TTFT p99 against the
control window (victims alone, the first window). Windows are counted from the run's first
send, which is the victims' first (they start with the load phase).
"""

from __future__ import annotations

import pandas as pd

from harness.analysis._latency import per_token_itl_s, percentile
from harness.analysis._leaves import leave_summary
from harness.runfolder import MatrixCell
from harness.scenario import VICTIMS, MatrixConfig, cell_name


def _victims(cell: MatrixCell, requests: pd.DataFrame, chunks: pd.DataFrame) -> MatrixCell:
    ttft = requests["ttft_ms"].dropna()
    itl = per_token_itl_s(chunks[chunks["request_id"].isin(requests["request_id"])])
    p99 = percentile(itl, 99)
    return cell.model_copy(
        update={
            "victim_requests": len(requests),
            "victim_ttft_p50_ms": percentile(ttft, 50),
            "victim_ttft_p99_ms": percentile(ttft, 99),
            "victim_itl_p99_ms": None if p99 is None else p99 * 1000.0,
        }
    )


def _leavers(cell: MatrixCell, gone: pd.DataFrame) -> MatrixCell:
    figures = leave_summary(gone)
    aborted = figures.pop("left_aborted")
    phases = figures.pop("leave_phases")
    update = {**figures, "phases": phases, "aborted": aborted, "never_aborted": len(gone) - aborted}
    return cell.model_copy(update=update)


def matrix_cells(
    matrix: MatrixConfig, requests: pd.DataFrame, chunks: pd.DataFrame
) -> list[MatrixCell]:
    """The control window, then every cell in run order (see the module docstring).
    ``requests`` is the analysed requests frame (with the leave columns), ``chunks`` the chunks
    frame. Empty when no request was sent."""
    if not len(requests):
        return []
    t0 = float(requests["t_send"].min())
    victims = requests[requests["group"] == VICTIMS]
    sent = victims["t_send"] - t0
    out = []
    windows = [("control", "control", -1), *((p, h, i) for i, (p, h) in enumerate(matrix.cells()))]
    for phase, how, index in windows:
        start, end = matrix.window(index)
        name = "control" if index < 0 else cell_name(phase, how)
        cell = MatrixCell(cell=name, phase=phase, leave=how, window_s=(start, end))
        cell = _victims(cell, victims[(sent >= start) & (sent < end)], chunks)
        if index >= 0:
            gone = requests[(requests["group"] == name) & requests["t_leave"].notna()]
            cell = _leavers(cell, gone)
        out.append(cell)
    control_p99 = out[0].victim_ttft_p99_ms
    if control_p99:
        out = [
            c.model_copy(
                update={
                    "victim_ttft_p99_ratio": None
                    if c.victim_ttft_p99_ms is None
                    else c.victim_ttft_p99_ms / control_p99
                }
            )
            for c in out
        ]
    return out
