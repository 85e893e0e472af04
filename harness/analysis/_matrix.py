"""The disconnect matrix's cells (``harness.scenario._matrix``) from a run's requests.

Each cell's clients left in its window; what the engine did with them comes from the leave
columns (``harness.analysis._leaves``). The victims' requests sent in a window say what the
cell cost the others: their TTFT p50/p99 and per-token ITL p99, and TTFT p99 against the
control window (victims alone, the first window). Windows are counted from the run's first
send, which is the victims' first (they start with the load phase).

A cell is **exercised** when at least one of its clients left in the phase it is named for,
by the engine's own records (``leave_phase``); without them, by the client's: one that had a
token before it left was past queue and prefill (``decode``), one that had none cannot be
placed. A cell none of whose clients left in its phase (they were still waiting for a model
lock, ``frontend``; still queued; generation had ended, ``finished``; or none left at all) is
not exercised: its figures about leaving in that phase are not measured (``None``) and the
phase they did reach is reported (:class:`~harness.runfolder.MatrixCell`).
"""

from __future__ import annotations

import pandas as pd

from harness.analysis._latency import per_token_itl_s, percentile
from harness.analysis._leaves import PHASES, leave_summary
from harness.runfolder import MatrixCell
from harness.scenario import VICTIMS, MatrixConfig


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


def judged_phases(gone: pd.DataFrame) -> tuple[pd.Series, str | None]:
    """Where each client of ``gone`` (rows with a ``t_leave``) was when it left, and from
    whose records: the engine's ``leave_phase`` (``"engine"``) when it has one for every
    row; else the client's (``"client"``): ``decode`` for one that had its first token before
    it left, ``None`` (cannot be told) for the others; ``None`` for an empty ``gone``."""
    if not len(gone):
        return gone["leave_phase"], None
    if gone["leave_phase"].notna().all():
        return gone["leave_phase"], "engine"
    had_token = gone["t_first_token"].notna() & (gone["t_first_token"] <= gone["t_leave"])
    return pd.Series(None, index=gone.index, dtype=object).mask(had_token, "decode"), "client"


def _exercise(cell: MatrixCell, phases: pd.Series) -> dict[str, object]:
    """``in_phase``, ``exercised`` and ``reached_phase`` of ``cell`` from its leavers'
    ``phases`` (see the module docstring)."""
    in_phase = int((phases == cell.phase).sum())
    if in_phase:
        return {"in_phase": in_phase, "exercised": True}
    if not len(phases):
        return {"exercised": False if cell.clients else None}
    if phases.isna().any():
        return {"exercised": None}
    counts = phases.value_counts()
    rank = {p: i for i, p in enumerate(PHASES)}
    reached = min(counts.index, key=lambda p: (-counts[p], rank.get(str(p), len(rank))))
    return {"exercised": False, "reached_phase": str(reached)}


def _leavers(cell: MatrixCell, theirs: pd.DataFrame) -> MatrixCell:
    """``cell`` with the figures of its clients ``theirs`` (the group's requests)."""
    gone = theirs[theirs["t_leave"].notna()]
    stayed = theirs[theirs["t_leave"].isna()]
    figures = leave_summary(gone)
    aborted = figures.pop("left_aborted")
    phases = figures.pop("leave_phases")
    judged, source = judged_phases(gone)
    cell = cell.model_copy(
        update={
            **figures, "clients": len(theirs), "phases": phases, "phase_source": source,
            "aborted": aborted, "never_aborted": len(gone) - aborted,
            "stayed": {str(k): int(v) for k, v in stayed["outcome"].value_counts().items()},
        }
    )  # fmt: skip
    update: dict[str, object] = _exercise(cell, judged)
    if update["exercised"] is False:
        update |= dict.fromkeys(MatrixCell.LEAVE_FIGURES)
    elif source != "engine":
        update["zombies"] = None  # a zombie left while the engine had its request: unknown
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
    windows = [(-1, None), *enumerate(matrix.cells())]
    for index, spec in windows:
        start, end = matrix.window(index)
        if spec is None:
            names = {"cell": "control", "phase": "control", "leave": "control"}
        else:
            names = {"cell": spec.name, "phase": spec.phase, "leave": spec.leave}
            names["answer"] = spec.answer
        cell = MatrixCell.model_validate({**names, "window_s": (start, end)})
        cell = _victims(cell, victims[(sent >= start) & (sent < end)], chunks)
        if spec is not None:
            cell = _leavers(cell, requests[requests["group"] == spec.name])
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
