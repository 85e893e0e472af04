"""A run's past in the history: the values of a figure in the runs of its series before it,
for its history gates (``harness.gates``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from harness.analysis import PlanRecord
from harness.history._entries import arm_info, entry_id, series_of
from harness.history._store import HistoryStore
from harness.scenario import Arm

Past = Callable[[str], Sequence[float]]


def past_of(path: Path | None, series: str, exclude: str) -> Past | None:
    """The values of a figure in the runs of ``series`` before this one (``exclude``: its
    own entry, in case the run was added already), oldest first, from the history at
    ``path``; a history that is missing is empty. ``None`` without a history. The function
    raises :class:`~zwcore.HistoryError` for a file that cannot be read."""
    if path is None:
        return None

    def values(figure: str) -> list[float]:
        if not path.is_file():
            return []
        with HistoryStore(path, read_only=True) as store:
            return [v for _, v in store.series_values(series, figure, exclude=exclude)]

    return values


def run_past(history: Path | None, info: dict[str, Any], arm: str) -> Past | None:
    """The past of a run (``info``: its ``run.json``; ``arm``: its configuration) in
    ``history``, for its history gates (:func:`past_of`)."""
    scenario = info.get("scenario", {})
    return past_of(
        history,
        series_of(scenario, arm, info),
        entry_id("run", scenario.get("name", ""), arm, info),
    )


def plan_past(history: Path | None, folder: Path, record: PlanRecord, arm: Arm) -> Past | None:
    """The past of the plan's configuration ``arm`` in ``history`` (:func:`past_of`)."""
    scenario = record.plan.scenario.model_dump(mode="json")
    info = arm_info(folder, record, arm)
    return past_of(history, series_of(scenario, arm.name, info),
                   entry_id("plan", record.plan.scenario.name, arm.name, record.info))  # fmt: skip
