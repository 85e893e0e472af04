"""The per-request swimlane: one lane per request, what the engine did with it above and what
its client saw below, on the report's time axis (seconds since ``RunData.t0``, the first
measurement, as the timelines).

Engine row, from ``engine_requests.parquet`` joined by ``requests.parquet``'s
``engine_request_id``: queued (arrival to first scheduled), prefill (to first token), decode
(to generation end), each minus the preempted spans (a preemption to its resume, or to
generation end or KV freed when it never resumed), the spans in which generation waited for the
server's send path with the engine kept (``send_blocked_at`` to ``send_unblocked_at``, between
the first token and the engine's release: a single-context engine such as llama-cpp-python), KV
held after generation (generation end to KV freed, when positive, less those spans) and a "KV
freed" mark. Client row, from ``requests.parquet`` and the raw records: waiting for the first
token (send to first token, else to first byte), receiving (from then to the last byte, minus
stalls), stalled (the records' ``stalls``; ``t_stall`` plus ``stall_s`` without records) and a
mark where the client saw a cut (``t_cut_seen``, ``cut_kind``).

No proxy row: what a proxy hop holds (its Send-Q toward the clients or the hop in front, its
Recv-Q from its upstream, its buffered bytes) is not observable per request for the gateways a
chain is made of: they multiplex many requests over their connections to the next hop (Traefik's
and LiteLLM's pooled keep-alive connections), and their metrics count per hop, not per stream.
So the report shows each hop over time instead, under the lanes on the same time axis
(``_plots.hops_timeline``, one trace per hop ``hop <i> <kind>``, from ``proxy.parquet``), and
its peaks in a table (``summary.json`` ``proxy.hops``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.outputs._format import fmt_number
from harness.outputs._report._data import RunData

MAX_LANES = 40

ENGINE_KINDS = {  # kind -> (legend label, colour)
    "queued": ("queued", "#a6a6a6"),
    "prefill": ("prefill", "#56b4e9"),
    "decode": ("decode", "#0072b2"),
    "preempted": ("preempted", "#cc79a7"),
    "kv_held": ("KV held after generation", "#a50f15"),
    "send_blocked": ("engine kept, generation waiting for delivery", "#fb6a4a"),
}
CLIENT_KINDS = {
    "waiting": ("waiting for the first token", "#d9d9d9"),
    "receiving": ("receiving", "#009e73"),
    "stalled": ("stalled (not reading)", "#e69f00"),  # the timeline's stall-onset colour
}
MARKS = {  # kind -> (legend label, row, marker symbol, colour)
    "kv_freed": ("KV freed", "engine", "line-ns-open", "#000000"),
    "cut_rst": ("cut seen (RST)", "client", "x", "#cc0000"),  # the timeline's cut colour
    "cut_fin": ("cut seen (FIN)", "client", "square-open", "#cc0000"),
}

JOIN_COLUMNS = ("engine_request_id",)


@dataclass(frozen=True)
class Span:
    """A coloured interval of one lane's ``row`` (``engine`` or ``client``); ``start_s`` and
    ``end_s`` are seconds since ``t0``."""

    lane: int
    row: str
    kind: str
    start_s: float
    end_s: float


@dataclass(frozen=True)
class Mark:
    """A point on one lane's row (``kind`` a key of :data:`MARKS`), ``s`` seconds since ``t0``."""

    lane: int
    kind: str
    s: float


@dataclass
class Swimlane:
    """The lanes to draw, slowest first. ``labels`` name the lanes (group and a short request
    id), ``numbers`` hold each lane's hover text; ``omitted`` counts the faster requests left
    out; ``note`` says why there is no engine row (``None`` when there is one)."""

    labels: list[str] = field(default_factory=list)
    numbers: list[str] = field(default_factory=list)
    spans: list[Span] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    omitted: int = 0
    note: str | None = None
    engine_rows: int = 0  # lanes that have an engine row

    @property
    def has_engine(self) -> bool:
        """Whether the lanes have an engine row (the engine's table joined)."""
        return self.note is None

    @property
    def unmatched(self) -> int:
        """Lanes without an engine row although the run has one (no engine id joined)."""
        return len(self.labels) - self.engine_rows if self.has_engine else 0


def _t(value: Any) -> float | None:
    """A time or number as a float; ``None`` for null or NaN."""
    if value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(out) else out


def _times(value: Any) -> list[float]:
    """A list column (``preempted_at``, ``resumed_at``) as sorted floats; ``[]`` for null."""
    if value is None or isinstance(value, float | str):
        return []
    return sorted(t for v in value if (t := _t(v)) is not None)


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


def preempted(engine: pd.Series) -> list[tuple[float, float]]:
    """The engine request's preempted spans (monotonic s): each ``preempted_at`` to the first
    later ``resumed_at`` not already used, else to generation end, else to KV freed."""
    resumes = _times(engine.get("resumed_at"))
    stop = _first(_t(engine.get("t_generation_end")), _t(engine.get("t_kv_freed")))
    out = []
    for p in _times(engine.get("preempted_at")):
        later = [r for r in resumes if r >= p]
        if later:
            resumes.remove(later[0])
            out.append((p, later[0]))
        elif stop is not None and stop > p:
            out.append((p, stop))
    return out


def engine_spans(engine: pd.Series) -> list[tuple[str, float, float]]:
    """``(kind, start, end)`` (monotonic s) of one ``engine_requests`` row. A moment that never
    came (null) ends the phase before it at the next one that did."""
    arrival, sched, first, gen_end, freed = (
        _t(engine.get(c)) for c in
        ("t_arrival", "t_first_scheduled", "t_first_token", "t_generation_end", "t_kv_freed")
    )  # fmt: skip
    end = _first(gen_end, freed)
    holes = preempted(engine)
    blocked = []
    last = _first(freed, end)
    if first is not None and last is not None:  # from the first token to the engine's release
        starts = _times(engine.get("send_blocked_at"))
        pairs = zip(starts, _times(engine.get("send_unblocked_at")), strict=False)
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
    req: pd.Series, stalls: Sequence[Sequence[float | None]] | None
) -> list[tuple[str, float, float]]:
    """``(kind, start, end)`` (monotonic s) of one ``requests`` row; ``stalls`` are the raw
    record's ``[start, end]`` pairs (``None`` without records: then ``t_stall`` plus
    ``stall_s``, an approximation that merges several stalls into one)."""
    send, lb, end = (_t(req.get(c)) for c in ("t_send", "t_last_byte", "t_end"))
    # Waiting lasts until the first token: a server that answers its headers at once and its
    # first token seconds later (llama-cpp-python behind a held lock) kept the client waiting.
    fb = _first(_t(req.get("t_first_token")), _t(req.get("t_first_byte")))
    cut = _t(req.get("t_cut_seen"))
    last = _first(end, cut, lb)
    holes: list[tuple[float, float]] = []
    if stalls is not None:
        for start, stop in stalls:
            s0, s1 = _t(start), _first(_t(stop), end, lb)
            if s0 is not None and s1 is not None and s1 > s0:
                holes.append((s0, s1))
    elif (t_stall := _t(req.get("t_stall"))) is not None:
        stall_s = _t(req.get("stall_s")) or 0.0
        stop = t_stall + stall_s if stall_s > 0 else last
        if last is not None and stop is not None:
            stop = min(stop, last)
        if stop is not None and stop > t_stall:
            holes.append((t_stall, stop))
    out: list[tuple[str, float, float]] = []
    wait_end = _first(fb, last)
    if send is not None and wait_end is not None and wait_end > send:
        out.append(("waiting", send, wait_end))
    if fb is not None and lb is not None and lb > fb:
        out += [("receiving", a, b) for a, b in subtract(fb, lb, holes) if b > a]
    out += [("stalled", a, b) for a, b in holes]
    return out


def engine_note(data: RunData) -> str | None:
    """Why the swimlane has no engine row, in one line; ``None`` when it has one."""
    if data.engine_error:
        return f"no engine row: {data.engine_error}"
    if data.engine_requests.empty:
        verdict = data.summary.get("verdicts", {}).get("kv_held_by_undelivered_streams", {})
        why = verdict.get("scrape_only_reason") or (data.info.get("engine_probe") or {}).get(
            "reason"
        )
        return (
            "no engine row: the engine wrote no per-request table (engine_requests.parquet): "
            "scrape-only: " + (why or "a url target, or a run older than the engine tables")
        )
    if "engine_request_id" not in data.engine_requests:
        return "no engine row: engine_requests.parquet has no engine_request_id column"
    if any(c not in data.requests for c in JOIN_COLUMNS):
        return (
            "no engine row: requests.parquet has no engine_request_id (analysed before the "
            "join existed; `zerowindow analyze RUN_DIR` adds it)"
        )
    if data.requests["engine_request_id"].isna().all():
        return "no engine row: no request matched a row of engine_requests.parquet"
    return None


def slowest(requests: pd.DataFrame) -> pd.DataFrame:
    """``requests`` sorted slowest first: by the larger of the client's e2e and the delivery
    lag (ms), where e2e falls back to the last client time minus the send."""
    times = [c for c in ("t_end", "t_cut_seen", "t_last_byte", "t_first_byte") if c in requests]
    e2e = requests["e2e_ms"] if "e2e_ms" in requests else pd.Series(math.nan, requests.index)
    if times and "t_send" in requests:
        span = requests[times].max(axis=1) - requests["t_send"]
        e2e = e2e.fillna(span * 1000.0)
    keys = [e2e.astype(float)]
    if "delivery_lag_ms" in requests:
        keys.append(requests["delivery_lag_ms"].astype(float))
    key = pd.concat(keys, axis=1).max(axis=1).fillna(-math.inf)
    return requests.assign(_key=key).sort_values("_key", ascending=False, kind="stable")


def _lane_text(req: pd.Series, engine: pd.Series | None) -> str:
    def n(col: str, unit: str = "") -> str:
        v = req.get(col)
        return fmt_number(None if v is None or pd.isna(v) else v) + unit

    lines = [
        f"<b>{req.get('group')}</b> {req.get('request_id')} ({req.get('outcome')})",
        f"e2e {n('e2e_ms', ' ms')} · TTFT {n('ttft_ms', ' ms')} · "
        f"{n('bytes_received', ' bytes')} received",
    ]
    if engine is not None:
        lines += [
            f"delivery lag {n('delivery_lag_ms', ' ms')} · "
            f"KV held after generation {n('kv_held_after_generation_ms', ' ms')}",
            f"undelivered bytes at generation end {n('undelivered_bytes_at_generation_end')} · "
            f"at KV free {n('undelivered_bytes_at_kv_free')}",
            f"engine: finish {fmt_number(engine.get('finish_reason'))}, "
            f"{len(_times(engine.get('preempted_at')))} preemption(s)",
        ]
    if _t(req.get("t_cut_seen")) is not None:
        lines.append(f"cut seen: {req.get('cut_kind')}")
    return "<br>".join(lines)


def swimlane(data: RunData, max_lanes: int = MAX_LANES) -> Swimlane:
    """The ``max_lanes`` slowest requests of ``data`` as lanes (see the module docstring)."""
    out = Swimlane(note=engine_note(data))
    req = data.requests
    if req.empty or "t_send" not in req:
        return out
    ordered = slowest(req)
    shown = ordered.head(max_lanes)
    out.omitted = len(ordered) - len(shown)
    engines: dict[str, pd.Series] = {}
    if out.has_engine:
        table = data.engine_requests
        table = table[table["engine_request_id"].isin(shown["engine_request_id"].dropna())]
        table = table.drop_duplicates("engine_request_id", keep="last")
        engines = {str(r["engine_request_id"]): r for _, r in table.iterrows()}
    stalls = {r.request_id: r.stalls for r in data.records}
    for lane, (_, r) in enumerate(shown.iterrows()):
        rid = str(r.get("request_id"))
        eid = r.get("engine_request_id") if out.has_engine else None
        engine = engines.get(str(eid)) if eid is not None and not pd.isna(eid) else None
        out.labels.append(f"{r.get('group')} · {rid[:8]}")
        out.numbers.append(_lane_text(r, engine))
        if engine is not None:
            out.engine_rows += 1
            for kind, a, b in engine_spans(engine):
                out.spans.append(Span(lane, "engine", kind, a - data.t0, b - data.t0))
            if (freed := _t(engine.get("t_kv_freed"))) is not None:
                out.marks.append(Mark(lane, "kv_freed", freed - data.t0))
        rec_stalls = stalls.get(rid) if data.records else None
        for kind, a, b in client_spans(r, rec_stalls):
            out.spans.append(Span(lane, "client", kind, a - data.t0, b - data.t0))
        if (cut := _t(r.get("t_cut_seen"))) is not None:
            kind = "cut_rst" if str(r.get("cut_kind")) == "rst" else "cut_fin"
            out.marks.append(Mark(lane, kind, cut - data.t0))
    return out
