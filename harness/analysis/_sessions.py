"""Session figures: whole conversations (``sessions``, ``sessions_complete``, session
duration) and the per-turn summaries ``<group>.turn1`` and ``<group>.later_turns``
(``loadgen._session_config``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
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
        **_evicted_figures(rows),
    }


def _evicted_figures(rows: pd.DataFrame) -> dict[str, Any]:
    """``returning_turns``, ``prefix_evicted`` and ``prefix_evicted_ratio`` over the returning
    turns whose engine record says (:func:`prefix_reuse`), and ``prefix_evicted_after_stall_ratio``
    over those that came back after a turn the client stalled; ``{}`` without engine records."""
    if "prefix_evicted" not in rows or not rows["prefix_evicted"].notna().any():
        return {}
    known = rows[rows["prefix_evicted"].notna()]
    evicted = known["prefix_evicted"].astype(bool)
    after = evicted[known["after_stall"].astype(bool)]
    return {
        "returning_turns": len(known),
        "prefix_evicted": int(evicted.sum()),
        "prefix_evicted_ratio": float(evicted.mean()),
        "prefix_evicted_after_stall_ratio": float(after.mean()) if len(after) else None,
    }


def prefix_reuse(requests: pd.DataFrame, block_tokens: int | None) -> pd.DataFrame:
    """``requests`` with, for each returning turn (turn 2 on) of a session: ``prefix_kept_tokens``,
    the full KV blocks (of ``block_tokens`` tokens) of the previous turn's prompt as the engine
    counted it (``engine_prompt_tokens``): what a prefix cache that kept the session's blocks
    serves at least, since this turn's prompt begins with that one; ``prefix_evicted``, whether
    the engine served fewer of this prompt's tokens from its cache (``prompt_cached_tokens``),
    so blocks of the session were evicted (or caching is off) between the turns; and
    ``after_stall``, whether the client stalled on the previous turn (its ``t_stall``). The last
    two are missing (NA) where a turn, its previous one or ``block_tokens`` is unknown, and
    where the previous prompt filled no block (nothing to keep). The previous answer's blocks
    are left out: the answer comes back as text, tokenized anew."""
    if "turn" not in requests or "prompt_cached_tokens" not in requests or not block_tokens:
        return requests
    turns = requests[requests["session_id"].notna() & requests["turn"].notna()]
    previous = turns.assign(turn=turns["turn"] + 1).set_index(["session_id", "turn"])
    key = pd.MultiIndex.from_frame(requests[["session_id", "turn"]])
    before = previous.reindex(key)
    kept = (before["engine_prompt_tokens"] // block_tokens * block_tokens).to_numpy(dtype=float)
    cached = requests["prompt_cached_tokens"].to_numpy(dtype=float)
    unknown = ~(kept > 0) | np.isnan(cached)  # NaN compares False
    stalled = (
        before["t_stall"].notna().to_numpy() if "t_stall" in before else np.zeros(len(kept), bool)
    )
    index = requests.index
    return requests.assign(
        prefix_kept_tokens=pd.Series(kept, index=index).astype("Int64"),
        prefix_evicted=pd.Series(cached < kept, index=index).astype("boolean").mask(unknown),
        after_stall=pd.Series(stalled, index=index).astype("boolean").mask(unknown),
    )


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
