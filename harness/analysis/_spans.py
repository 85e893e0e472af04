"""A request's life as spans, one implementation for the report's swimlane and the run's
OpenTelemetry traces (``harness.analysis._otlp``).

Engine spans, from one row of ``engine_requests.parquet`` (:func:`engine_spans`): queued
(arrival to first scheduled), prefill (to first token), decode (to generation end), each minus
the preempted spans (a preemption to its resume, or to generation end or KV freed when it never
resumed), the spans in which generation waited for the server's send path with the engine kept
(``send_blocked_at`` to ``send_unblocked_at``), and KV held after generation (generation end to
KV freed, when positive, less those spans). Client spans, from one row of ``requests.parquet``
and the record's stalls (:func:`client_spans`). Times are monotonic seconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

Row = pd.Series | Mapping[Any, Any]
"""A table row: a ``pandas.Series``, or a ``dict`` of ``DataFrame.to_dict("records")``."""


def finite(value: Any) -> float | None:
    """A time or number as a float; ``None`` for null or NaN."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def sorted_times(value: Any) -> list[float]:
    """A list column (``preempted_at``, ``resumed_at``) as sorted floats; ``[]`` for null."""
    if value is None or isinstance(value, float | str):
        return []
    return sorted(t for v in value if (t := finite(v)) is not None)


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def subtract(a: float, b: float, holes: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """``[a, b]`` minus the intervals ``holes``: the pieces that remain, in order (seconds)."""
    pieces = [(a, b)]
    for h0, h1 in sorted(holes):
        out = []
        for p0, p1 in pieces:
            if h1 <= p0 or h0 >= p1:
                out.append((p0, p1))
                continue
            if h0 > p0:
                out.append((p0, h0))
            if h1 < p1:
                out.append((h1, p1))
        pieces = out
    return pieces


def preempted(engine: Row) -> list[tuple[float, float]]:
    """The engine request's preempted spans (monotonic s): each ``preempted_at`` to the first
    later ``resumed_at`` not already used, else to generation end, else to KV freed."""
    resumes = sorted_times(engine.get("resumed_at"))
    stop = _first(finite(engine.get("t_generation_end")), finite(engine.get("t_kv_freed")))
    out = []
    for p in sorted_times(engine.get("preempted_at")):
        later = [r for r in resumes if r >= p]
        if later:
            resumes.remove(later[0])
            out.append((p, later[0]))
        elif stop is not None and stop > p:
            out.append((p, stop))
    return out


def engine_spans(engine: Row) -> list[tuple[str, float, float]]:
    """``(kind, start, end)`` (monotonic s) of one ``engine_requests`` row. A moment that never
    came (null) ends the phase before it at the next one that did."""
    arrival, sched, first, gen_end, freed = (
        finite(engine.get(c)) for c in
        ("t_arrival", "t_first_scheduled", "t_first_token", "t_generation_end", "t_kv_freed")
    )  # fmt: skip
    end = _first(gen_end, freed)
    holes = preempted(engine)
    blocked = []
    last = _first(freed, end)
    if first is not None and last is not None:  # from the first token to the engine's release
        starts = sorted_times(engine.get("send_blocked_at"))
        pairs = zip(starts, sorted_times(engine.get("send_unblocked_at")), strict=False)
        blocked = [(max(a, first), min(b, last)) for a, b in pairs if min(b, last) > max(a, first)]
    phases = [
        ("queued", arrival, _first(sched, first, end)),
        ("prefill", sched, _first(first, end)),
        ("decode", first, end),
    ]
    out = []
    for kind, a, b in phases:
        if a is not None and b is not None and b > a:
            cut = holes + blocked if kind == "decode" else holes
            out += [(kind, p0, p1) for p0, p1 in subtract(a, b, cut) if p1 > p0]
    out += [("preempted", p0, p1) for p0, p1 in holes]
    out += [("send_blocked", p0, p1) for p0, p1 in blocked]
    if gen_end is not None and freed is not None and freed > gen_end:
        out += [("kv_held", a, b) for a, b in subtract(gen_end, freed, blocked) if b > a]
    return out


def client_spans(
    req: Row, stalls: Sequence[Sequence[float | None]] | None
) -> list[tuple[str, float, float]]:
    """``(kind, start, end)`` (monotonic s) of one ``requests`` row: ``connect`` (send to
    ``t_connected``, where the row has it), ``waiting`` (from then to the first token, else the
    first byte), ``receiving`` (to the last byte, less the stalls), ``stalled``. ``stalls``
    are the raw record's ``[start, end]`` pairs (``None`` without records: then ``t_stall`` plus
    ``stall_s``, an approximation that merges several stalls into one)."""
    send, lb, end = (finite(req.get(c)) for c in ("t_send", "t_last_byte", "t_end"))
    connected = finite(req.get("t_connected"))
    # Waiting lasts until the first token: a server that answers its headers at once and its
    # first token seconds later (llama-cpp-python behind a held lock) kept the client waiting.
    fb = _first(finite(req.get("t_first_token")), finite(req.get("t_first_byte")))
    cut = finite(req.get("t_cut_seen"))
    last = _first(end, cut, lb)
    holes: list[tuple[float, float]] = []
    if stalls is not None:
        for start, stop in stalls:
            s0, s1 = finite(start), _first(finite(stop), end, lb)
            if s0 is not None and s1 is not None and s1 > s0:
                holes.append((s0, s1))
    elif (t_stall := finite(req.get("t_stall"))) is not None:
        stall_s = finite(req.get("stall_s")) or 0.0
        stop = t_stall + stall_s if stall_s > 0 else last
        if last is not None and stop is not None:
            stop = min(stop, last)
        if stop is not None and stop > t_stall:
            holes.append((t_stall, stop))
    out: list[tuple[str, float, float]] = []
    if send is not None and connected is not None and connected > send:
        out.append(("connect", send, connected))
    wait_start = _first(connected, send)
    wait_end = _first(fb, last)
    if wait_start is not None and wait_end is not None and wait_end > wait_start:
        out.append(("waiting", wait_start, wait_end))
    if fb is not None and lb is not None and lb > fb:
        out += [("receiving", a, b) for a, b in subtract(fb, lb, holes) if b > a]
    out += [("stalled", a, b) for a, b in holes]
    return out
