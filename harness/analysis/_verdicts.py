"""Verdicts: answers to the toolkit's questions, computed from what was measured.

**KV held by undelivered streams.** Once the engine has finished generating (it reports no
running request, or a configured bound has passed), any KV cache usage that
remains while server sockets still hold undelivered bytes in Send-Q is KV held hostage by slow
readers. The verdict is ``held`` (with the peak usage, how long, and KV-seconds, the integral
of the usage fraction over time), ``none`` (usage was 0 throughout a long enough window with
undelivered data), or ``not_observed`` (no such window: the experiment could not tell).
Waiting requests do not count against "finished": on a server that couples KV to the socket,
requests that cannot be admitted because held KV fills the cache are the hostage effect itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class KvHeldVerdict:
    """The KV-held verdict. Durations in seconds; usage as percent of the KV cache;
    ``kv_seconds`` in usage-fraction × seconds; ``undelivered_peak_bytes`` is the largest total
    Send-Q of the server's connections in the window; ``t_generation_end`` (monotonic s) is
    the first scrape after generation that saw undelivered bytes."""

    status: str  # "held" | "none" | "not_observed"
    window_s: float
    kv_held_s: float
    kv_held_peak_perc: float
    kv_seconds: float
    undelivered_peak_bytes: int
    t_generation_end: float | None

    def line(self) -> str:
        """One human-readable sentence."""
        if self.status == "held":
            return (
                f"KV held by undelivered streams: HELD, peak {self.kv_held_peak_perc:.1f} % for "
                f"{self.kv_held_s:.1f} s ({self.kv_seconds:.2f} KV-seconds) while "
                f"{self.undelivered_peak_bytes} B sat undelivered in Send-Q"
            )
        if self.status == "none":
            return (
                "KV held by undelivered streams: none held (KV usage 0 % for "
                f"{self.window_s:.1f} s after generation ended, while "
                f"{self.undelivered_peak_bytes} B sat undelivered in Send-Q)"
            )
        return (
            "KV held by undelivered streams: not observed (no undelivered data in Send-Q after "
            "generation ended)"
        )

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def _held_episodes(proof: np.ndarray, holding: np.ndarray) -> np.ndarray:
    """Samples that belong to a held episode: one starts at a ``proof`` sample and lasts while
    ``holding`` stays true."""
    held = np.zeros(len(proof), dtype=bool)
    active = False
    for i in range(len(proof)):
        active = bool(proof[i]) or (active and bool(holding[i]))
        held[i] = active
    return held


def kv_held_verdict(
    metrics: pd.DataFrame,
    sockets: pd.DataFrame,
    *,
    t_first_send: float | None,
    generation_bound_s: float | None = None,
    min_observe_s: float = 1.0,
) -> KvHeldVerdict:
    """Compute the KV-held verdict.

    ``metrics`` has columns ``t``, ``scrape_ok``, ``kv_cache_usage`` (0..1) and
    ``num_requests_running``; ``sockets`` has ``t`` and
    ``send_q_bytes`` per connection and sample. Each successful scrape is paired with the latest
    socket sample at or before it. A scrape counts as after generation when no request is
    running, or when ``generation_bound_s`` has passed since ``t_first_send``.

    KV counts as held from the first of two scrapes in a row after generation with KV usage
    above 0 and bytes in Send-Q, for as long as both stay above 0, even while requests run
    again: on a coupled
    engine, victims admitted into the few free blocks run, get preempted and wait in turn, so
    "running" flickers while the hostage KV stays. ``kv_seconds`` integrates the whole KV usage
    over those episodes, an upper bound when victims run meanwhile; ``kv_held_peak_perc`` is
    the peak over the episodes' scrapes after generation (the held KV without the victims');
    ``window_s`` is the time after generation with bytes in Send-Q, held episodes included,
    so ``kv_held_s`` never exceeds it.
    """
    empty = KvHeldVerdict("not_observed", 0.0, 0.0, 0.0, 0.0, 0, None)
    needed = {"kv_cache_usage", "num_requests_running"}
    if metrics.empty or sockets.empty or not needed <= set(metrics.columns):
        return empty
    m = metrics[metrics["scrape_ok"]].dropna(subset=list(needed)).sort_values("t")
    if m.empty:
        return empty
    send_q = sockets.groupby("t")["send_q_bytes"].sum().sort_index().reset_index()
    joined = pd.merge_asof(m, send_q, on="t", direction="backward")
    joined["send_q_bytes"] = joined["send_q_bytes"].fillna(0)
    idle = joined["num_requests_running"] == 0
    if generation_bound_s is not None and t_first_send is not None:
        idle |= joined["t"] >= t_first_send + generation_bound_s
    after = idle & (joined["send_q_bytes"] > 0)
    if not after.any():
        return empty
    t_end = float(joined.loc[after, "t"].iloc[0])
    # Each sample stands for the interval until the next one.
    dt = joined["t"].diff().shift(-1).fillna(0.0).to_numpy()
    window = after.to_numpy()
    usage = joined["kv_cache_usage"].to_numpy()
    suspect = window & (usage > 0)
    # A request that just finished may hold its blocks for the few ms its last bytes take to
    # leave; only a state seen in two scrapes in a row counts as proof.
    proof = suspect & np.concatenate(([False], suspect[:-1]))
    held = _held_episodes(proof, (joined["send_q_bytes"] > 0).to_numpy() & (usage > 0))
    if held.any():
        held |= np.concatenate((proof[1:], [False]))  # the episode began one scrape earlier
    # The held time can run on while victims run again: the window holds it too.
    window_s = float(dt[window | held].sum())
    verdict = KvHeldVerdict(
        status="held" if held.any() else "none",
        window_s=window_s,
        kv_held_s=float(dt[held].sum()),
        # while nothing runs (or past the bound): not the KV of victims admitted meanwhile
        kv_held_peak_perc=float(np.max(usage[held & window], initial=0.0) * 100.0),
        kv_seconds=float((usage * dt)[held].sum()),
        undelivered_peak_bytes=int(joined.loc[after, "send_q_bytes"].max()),
        t_generation_end=t_end,
    )
    if verdict.status == "none" and window_s < min_observe_s:
        return KvHeldVerdict("not_observed", window_s, 0.0, 0.0, 0.0,
                             verdict.undelivered_peak_bytes, t_end)  # fmt: skip
    return verdict


def engine_costs(server: dict[str, Any], send_q_peak_bytes: float) -> dict[str, Any] | None:
    """What undelivered streams cost an engine that does not hold KV for them, from the engine
    process's samples (``server``: :class:`~harness.runfolder.ServerSummary` as a dict): its
    thread count (first sample and peak), its RSS growth over the first sample (MB), and
    ``send_q_peak_bytes``, the largest total Send-Q of the load's connections in the run
    (``undelivered_peak_bytes``). ``None`` when the run sampled no engine process (a target
    the run did not start)."""
    start, peak = server.get("server_threads_start"), server.get("server_threads_peak")
    growth = server.get("server_rss_growth_mb")
    if start is None or peak is None or growth is None:
        return None
    undelivered = int(send_q_peak_bytes)
    line = (
        f"engine process: threads {start:.0f} -> {peak:.0f} at peak, RSS +{growth:.1f} MB "
        f"(peak {server.get('server_rss_peak_mb') or 0:.1f} MB)"
    )
    if undelivered:
        line += f", while up to {undelivered / 1e6:.2f} MB sat undelivered in Send-Q"
    return {
        "threads_start": start,
        "threads_peak": peak,
        "rss_growth_mb": growth,
        "undelivered_peak_bytes": undelivered,
        "line": line,
    }
