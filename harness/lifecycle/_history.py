"""The end of every plan: its runs added to the history (``harness.history``).

A plan of one adds its run; a plan of several adds each configuration over its repeats (a
sweep: each step). What happened is in the plan's result (:class:`HistoryRecord`) and in its
``run.json`` or ``plan.json`` (``history_added``, or ``history_error`` with why); a history
that cannot be written is a warning on stderr and never changes the run's exit code.
"""

from __future__ import annotations

import sys
from pathlib import Path

from harness.history import add_folders
from harness.lifecycle._results import HistoryRecord, PlanResult
from harness.runfolder import PLAN_JSON, RUN_JSON, read_json, write_json
from zwcore import ZerowindowError


def remember(result: PlanResult, history: Path | None) -> PlanResult:
    """Add ``result``'s folder to ``history`` (``None``: nothing to do) and return it with
    :attr:`PlanResult.history` set."""
    if history is None:
        return result
    record = HistoryRecord(history)
    try:
        new, _, skipped = add_folders(history, [result.run_dir])
        record.added = len(new)
        if skipped:
            record.error = "; ".join(skipped)
    except (ZerowindowError, OSError) as exc:
        record.error = str(exc)
    if record.error:
        print(f"warning: history: {record.error}", file=sys.stderr)
    result.history = record
    name = RUN_JSON if (result.run_dir / RUN_JSON).is_file() else PLAN_JSON
    try:
        info = read_json(result.run_dir / name)
        info.update(history_added=record.added, history_error=record.error)
        write_json(result.run_dir / name, info)
    except (ZerowindowError, OSError) as exc:
        print(f"warning: history: {exc}", file=sys.stderr)
    return result
