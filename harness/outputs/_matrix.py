"""The disconnect matrix as heat-map tables: phases down (a row per phase and way of asking
for the answer: ``decode``, ``decode (whole)``), ways of leaving across.

One grid per question: how long after leaving the engine aborted the clients (p50 and max,
and how many of the cell's clients it aborted at all), the tokens generated that the leavers
never received (decoded for nobody: before they left, unread, or after), and the
victims' TTFT p99 against the control window. A cell none of whose clients left in its phase
says so, with where they were instead (``not exercised: frontend 2``), and has no heat. Used
by the console, the HTML report and the suite's case lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from harness.outputs._format import fmt_number as _f
from harness.runfolder import MatrixCell


@dataclass(frozen=True)
class MatrixGrid:
    """``cells[row][leave]``, with the row and column order of the run; a row is a phase,
    ``(whole)`` added for cells whose answers were asked whole (:func:`row_name`)."""

    phases: list[str]
    leaves: list[str]
    cells: dict[str, dict[str, MatrixCell]]
    control: MatrixCell | None


def row_name(c: MatrixCell) -> str:
    """The grid row of ``c``: its phase, ``"<phase> (whole)"`` for answers asked whole."""
    return c.phase if c.answer == "stream" else f"{c.phase} (whole)"


def matrix_grid(cells: list[MatrixCell]) -> MatrixGrid:
    """The run's matrix cells (``RunSummary.matrix``) arranged as a grid."""
    phases: list[str] = []
    leaves: list[str] = []
    grid: dict[str, dict[str, MatrixCell]] = {}
    control = None
    for c in cells:
        if c.phase == "control":
            control = c
            continue
        row = row_name(c)
        if row not in phases:
            phases.append(row)
        if c.leave not in leaves:
            leaves.append(c.leave)
        grid.setdefault(row, {})[c.leave] = c
    return MatrixGrid(phases, leaves, grid, control)


def exercise_text(c: MatrixCell) -> str:
    """Whether the cell did what it is named for: ``""`` (it did, or it cannot be told),
    ``"not exercised: <where they were> (0 of <left> left in <phase>)"``, or ``"not
    exercised: none of <clients> left (<outcomes>)"``."""
    if c.exercised is not False:
        return ""
    if not c.left:
        why = ", ".join(f"{o} {n}" for o, n in c.stayed.items()) or "none sent"
        return f"not exercised: none of {c.clients} left ({why})"
    where = ", ".join(f"{p} {n}" for p, n in c.phases.items()) or f"{c.reached_phase} (client)"
    return f"not exercised: {where} (0 of {c.left} left in {c.phase})"


def abort_text(c: MatrixCell) -> str:
    """``"p50 / max ms (aborted/left)"``, ``"never (0/left)"`` when some left while the engine
    still ran them, else ``"none to abort (0/left: <phases>)"`` (they left after generation
    ended, or the engine never had them); for a cell that was not exercised its
    :func:`exercise_text`."""
    if c.exercised is False:
        return exercise_text(c)
    if not c.left:
        return "-"
    if not c.aborted:
        if c.zombies:
            return f"never (0/{c.left})"
        where = ", ".join(f"{p} {n}" for p, n in c.phases.items()) or "phase unknown"
        return f"none to abort (0/{c.left}: {where})"
    p50, worst = _f(c.leave_to_abort_p50_ms, 0), _f(c.leave_to_abort_max_ms, 0)
    return f"{p50} / {worst} ({c.aborted}/{c.left})"


def abort_level(c: MatrixCell) -> int | None:
    """0 (aborted within 1 s) to 3 (some left while running and were never aborted): the heat
    of a cell; ``None`` (no heat) for a cell that was not exercised."""
    if c.exercised is False:
        return None
    if not c.left:
        return 0
    if c.zombies:
        return 3
    worst = c.leave_to_abort_max_ms or 0.0
    return 0 if worst <= 1000 else 1 if worst <= 5000 else 2


WASTED_TITLE = "tokens generated that the leaver never received (mean per client)"
"""What :func:`wasted_text` gives (``tokens_after_leave_mean``): unread when it left, or
decoded after."""


def wasted_text(c: MatrixCell) -> str:
    """Mean tokens the engine generated per client after it left."""
    return _f(c.tokens_after_leave_mean, 0)


def ratio_text(c: MatrixCell) -> str:
    """The victims' TTFT p99 in the cell's window over the control window's."""
    return _f(c.victim_ttft_p99_ratio, 2)


_STYLE = ("green", "yellow", "dark_orange", "bold red")


def _styled(text: str, level: int | None) -> str:
    return f"[{'magenta' if level is None else _STYLE[level]}]{text}[/]"


def print_matrix(cells: list[MatrixCell], console: Console) -> None:
    """Print the grids of ``cells`` (nothing without cells)."""
    if not cells:
        return
    g = matrix_grid(cells)
    tables: list[tuple[str, Callable[[MatrixCell], str], bool]] = [
        ("leave -> engine abort, ms p50 / max (aborted/left)", abort_text, True),
        (WASTED_TITLE, wasted_text, False),
        ("victims' TTFT p99, x control", ratio_text, False),
    ]
    for title, text, heat in tables:
        table = Table(title=f"disconnect matrix: {title}", title_justify="left")
        table.add_column("phase")
        for leave in g.leaves:
            table.add_column(leave, justify="right")
        for phase in g.phases:
            row = []
            for leave in g.leaves:
                c = g.cells[phase].get(leave)
                cell = "-" if c is None else text(c)
                row.append(_styled(cell, abort_level(c)) if heat and c else cell)
            table.add_row(phase, *row)
        console.print(table)
    if g.control is not None:
        console.print(
            f"[dim]control window (victims alone): TTFT p99 {_f(g.control.victim_ttft_p99_ms, 1)} "
            f"ms over {g.control.victim_requests} requests; a client's phase is the engine's "
            "own record of it when the client left (summary.json matrix[].phases)[/dim]"
        )
    idle = [c for row in g.cells.values() for c in row.values() if c.exercised is False]
    if idle:
        console.print(
            f"[magenta]not exercised (no client left in the phase the cell is named for; its "
            f"gates are inconclusive): {', '.join(c.cell for c in idle)}[/]"
        )
