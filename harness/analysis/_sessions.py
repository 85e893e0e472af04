"""Session figures: whole conversations (``sessions``, ``sessions_complete``, session
duration) and the per-turn summaries ``<group>.turn1`` and ``<group>.later_turns``
(``loadgen._session_config``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd

from harness.analysis._latency import percentile
from harness.runfolder import GroupSummary
from loadgen import TURN_PARTS, UserGroupConfig, turn_part


def session_figures(req: pd.DataFrame) -> dict[str, Any]:
    """The session fields of a group's summary from its rows of ``requests.parquet``:
    ``sessions`` (distinct ``session_id``), ``sessions_complete`` (a last turn with
    ``session_end == "done"``) and ``session_duration_p50_s``/``_p99_s`` of the complete
    ones (first ``t_send`` to last ``t_end``, s). Empty without sessions."""
    if "session_id" not in req or not req["session_id"].notna().any():
        return {}
    rows = req[req["session_id"].notna()]
    by = rows.groupby("session_id")
    done = by["session_end"].agg(lambda ends: bool((ends == "done").any()))
    span = by["t_end"].max() - by["t_send"].min()
    complete = span[done[span.index]].dropna()
    return {
        "sessions": int(len(done)),
        "sessions_complete": int(done.sum()),
        "session_duration_p50_s": percentile(complete, 50),
        "session_duration_p99_s": percentile(complete, 99),
    }


def turn_summaries(
    groups: Sequence[UserGroupConfig],
    requests: pd.DataFrame,
    summarize: Callable[[str, pd.DataFrame], GroupSummary],
) -> list[GroupSummary]:
    """For each group with a ``session``: ``summarize(f"{group}.{part}", rows)`` for each
    :data:`~loadgen.TURN_PARTS` part, its first turns and its later ones, without the session
    fields (a part holds pieces of sessions: they are its group's)."""
    if "turn" not in requests:
        return []
    part = requests["turn"].map(lambda t: None if pd.isna(t) else turn_part(int(t)))
    return [
        summarize(
            f"{g.name}.{p}", requests[(requests["group"] == g.name) & (part == p)]
        ).model_copy(update=_NO_SESSIONS)
        for g in groups
        if g.session is not None
        for p in TURN_PARTS
    ]


_NO_SESSIONS = {
    "sessions": 0, "sessions_complete": 0,
    "session_duration_p50_s": None, "session_duration_p99_s": None,
}  # fmt: skip
