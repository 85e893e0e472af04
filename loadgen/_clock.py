"""One clock for every load process: a remote worker's offset to the harness's clock.

A worker on another machine stamps its records with its own ``CLOCK_MONOTONIC``, which has
nothing to do with the harness's (each machine counts from its own boot; a Linux time
namespace, time_namespaces(7), shifts it further). The group's Locust master runs on the
harness's machine, on its clock, and measures each forwarding worker's offset the way
Cristian's algorithm and NTP's on-wire protocol do (RFC 5905 section 8): it sends a ping
stamped ``t0``, the worker answers with its own clock ``tw``, the master stamps the answer's
arrival ``t1``. Then ``offset = tw - (t0 + t1) / 2`` (worker clock minus harness clock) is
right to within ``(t1 - t0) / 2`` however the round trip splits between the two directions.

The master sends a burst of :data:`PINGS_PER_BURST` pings when the worker says hello and
another every :data:`BURST_INTERVAL_S`, and logs every answer to ``workers-<group>.jsonl`` as
``{"event": "clock", "worker": W, "burst": B, "offset_s": ..., "rtt_s": ..., "t": ...}``.

:func:`clock_estimates` reads them back: the offset is that of the sample with the shortest
round trip; its bound is the smallest ``B`` such that every burst's best sample agrees with
``offset +- B`` (``|offset_i - offset| + rtt_i / 2`` at most), so a clock that drifted during
the run widens the bound instead of going unnoticed. Records of that worker are moved onto the
harness's clock with :func:`to_harness_clock`. Workers the harness starts itself share its
clock and are not pinged. Importing this module does not import Locust.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from ._records import Chunk, RequestRecord
from ._workers import workers_log

PING = "zw_clock_ping"
PONG = "zw_clock_pong"
PINGS_PER_BURST = 5
PING_SPACING_S = 0.02
BURST_INTERVAL_S = 2.0
CLOCK_EVENT = "clock"
SCHEDULE_START = "zw_schedule_start"
"""The master's message to each worker of an open-loop group once all have spawned: the moment
on the worker's own clock (``{"t0": s}``) at which the shared schedule starts."""
START_MARGIN_S = 0.25
"""How far ahead of the message the shared schedule starts (s): time for it to arrive."""


@dataclass(frozen=True)
class ClockEstimate:
    """A worker's clock against the harness's: ``offset_s`` (worker minus harness, seconds),
    within ``bound_s`` (seconds) at every burst; ``samples`` answers in ``bursts`` bursts;
    ``rtt_min_s`` the shortest round trip (seconds)."""

    offset_s: float
    bound_s: float
    samples: int
    bursts: int
    rtt_min_s: float

    def as_dict(self) -> dict[str, float | int]:
        """The estimate for run.json and the summary: ``offset_s``, ``bound_ms``,
        ``rtt_min_ms``, ``samples``, ``bursts``."""
        return {
            "offset_s": round(self.offset_s, 6),
            "bound_ms": round(self.bound_s * 1000.0, 3),
            "rtt_min_ms": round(self.rtt_min_s * 1000.0, 3),
            "samples": self.samples,
            "bursts": self.bursts,
        }


def ping(burst: int, t0: float) -> dict[str, float | int]:
    """The master's ping: its burst number and send time ``t0`` (harness monotonic s)."""
    return {"burst": burst, "t0": t0}


def pong(ping_data: dict[str, float | int], tw: float) -> dict[str, float | int]:
    """The worker's answer to ``ping_data``: the ping echoed, plus ``tw`` (its monotonic s)."""
    return {**ping_data, "tw": tw}


def sample(pong_data: dict[str, float | int], t1: float) -> dict[str, float | int]:
    """One measurement from an answer received at ``t1`` (harness monotonic s): ``burst``,
    ``offset_s`` and ``rtt_s``. Raises ``KeyError``/``TypeError``/``ValueError`` for an answer
    that is not a :func:`pong`."""
    t0, tw = float(pong_data["t0"]), float(pong_data["tw"])
    return {"burst": int(pong_data["burst"]), "offset_s": tw - (t0 + t1) / 2, "rtt_s": t1 - t0}


def estimate(samples: list[dict[str, float | int]]) -> ClockEstimate | None:
    """The estimate from one worker's samples (module docstring); ``None`` without any."""
    if not samples:
        return None
    best = min(samples, key=lambda s: s["rtt_s"])
    per_burst: dict[int, dict[str, float | int]] = {}
    for s in samples:
        known = per_burst.get(int(s["burst"]))
        if known is None or s["rtt_s"] < known["rtt_s"]:
            per_burst[int(s["burst"])] = s
    offset = float(best["offset_s"])
    bound = max(
        abs(float(s["offset_s"]) - offset) + float(s["rtt_s"]) / 2 for s in per_burst.values()
    )
    return ClockEstimate(offset, bound, len(samples), len(per_burst), float(best["rtt_s"]))


def clock_estimates(run_dir: str | os.PathLike[str], group: str) -> dict[str, ClockEstimate]:
    """Each pinged worker's estimate from the master's log of ``group`` in ``run_dir`` (by
    worker name; empty without a log or pings). Lines that are not clock samples, or are cut
    short by a kill, are skipped. Raises ``OSError`` if the log exists but cannot be read."""
    path = Path(workers_log(run_dir, group))
    if not path.exists():
        return {}
    by_worker: dict[str, list[dict[str, float | int]]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
            if event.get("event") != CLOCK_EVENT:
                continue
            s = {k: event[k] for k in ("burst", "offset_s", "rtt_s")}
            by_worker.setdefault(str(event["worker"]), []).append(s)
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return {w: e for w, s in by_worker.items() if (e := estimate(s)) is not None}


def _moved(t: float | None, by_s: float) -> float | None:
    return None if t is None else t - by_s


def to_harness_clock(record: RequestRecord, clock: ClockEstimate) -> RequestRecord:
    """``record`` with every monotonic time moved onto the harness's clock by ``clock``'s
    offset, and ``clock_bound_ms`` set to its bound. ``t_send_wall`` (wall clock) is left as
    it is."""
    offset_s = clock.offset_s
    return replace(
        record,
        clock_bound_ms=clock.bound_s * 1000.0,
        t_send=record.t_send - offset_s,
        t_connected=_moved(record.t_connected, offset_s),
        t_first_byte=_moved(record.t_first_byte, offset_s),
        t_first_token=_moved(record.t_first_token, offset_s),
        t_last_byte=_moved(record.t_last_byte, offset_s),
        t_end=_moved(record.t_end, offset_s),
        t_action=_moved(record.t_action, offset_s),
        t_cut_seen=_moved(record.t_cut_seen, offset_s),
        t_scheduled=_moved(record.t_scheduled, offset_s),
        chunks=[Chunk(c.t - offset_s, c.tokens, c.bytes, c.text) for c in record.chunks],
        stalls=[[_moved(a, offset_s), _moved(b, offset_s)] for a, b in record.stalls],
    )
