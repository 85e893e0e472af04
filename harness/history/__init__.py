"""The history of every run: a DuckDB store (:mod:`~harness.history._store`), the entries it
keeps (:mod:`~harness.history._entries`), change points and the trend verdict of a history
gate (:mod:`~harness.history._trend`).

Where the history is, first that applies: ``--history PATH`` (``--no-history``: none), the
environment variable ``ZEROWINDOW_HISTORY`` (a path, or ``off``; empty is unset), the
scenario's ``[history] path`` (``enabled = false``: none), else ``history.duckdb`` in the
results folder (``--out``, ``results/`` by default).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from harness.history._entries import (
    Entry,
    arm_info,
    entry_id,
    folder_entries,
    plan_entries,
    run_entry,
    series_key,
    series_of,
)
from harness.history._past import Past, past_of, plan_past, run_past
from harness.history._store import HistoryStore
from harness.history._trend import (
    MIN_RUNS,
    ChangePoint,
    Trend,
    change_points,
    judge_trend,
    worse_direction,
)
from harness.history._trends import DEFAULT_FIGURES, FigureTrend, series_label, trends
from harness.scenario import HistoryConfig
from zwcore import HistoryError

HISTORY_ENV = "ZEROWINDOW_HISTORY"
HISTORY_FILE = "history.duckdb"
_OFF = ("off", "none", "false", "0")


def history_path(
    option: Path | None, enabled: bool, config: HistoryConfig, out_root: Path
) -> Path | None:
    """The history file of a run (module docstring): ``option`` is ``--history`` and
    ``enabled`` false for ``--no-history``; ``config`` the scenario's ``[history]``.
    ``None``: no history."""
    if not enabled:
        return None
    if option is not None:
        return option
    value = os.environ.get(HISTORY_ENV, "").strip()
    if value:  # set and not empty (an empty value, as CI gives an unset variable, is unset)
        return None if value.lower() in _OFF else Path(value)
    if not config.enabled:
        return None
    return config.path if config.path is not None else out_root / HISTORY_FILE


def add_folders(path: Path, folders: Sequence[Path]) -> tuple[list[Entry], int, list[str]]:
    """Add the entries of ``folders`` (:func:`folder_entries`) to the history at ``path``:
    returns the new entries, how many were there already, and the folders skipped (with
    why). Raises :class:`~zwcore.HistoryError` for a history that cannot be written and
    :class:`~zwcore.RunFolderError` for a folder with no run in it."""
    skipped: list[str] = []
    entries = [e for folder in folders for e in folder_entries(folder, skipped)]
    with HistoryStore(path) as store:
        new = store.add(entries)
    return new, len({e.entry_id for e in entries}) - len(new), skipped


__all__ = [
    "HISTORY_ENV",
    "HISTORY_FILE",
    "MIN_RUNS",
    "DEFAULT_FIGURES",
    "FigureTrend",
    "series_label",
    "trends",
    "arm_info",
    "plan_past",
    "run_past",
    "ChangePoint",
    "Entry",
    "HistoryError",
    "HistoryStore",
    "Past",
    "Trend",
    "add_folders",
    "change_points",
    "entry_id",
    "folder_entries",
    "history_path",
    "judge_trend",
    "past_of",
    "plan_entries",
    "run_entry",
    "series_key",
    "series_of",
    "worse_direction",
]
