"""The per-request swimlane: one lane per request, what the engine did with it above and what
its client saw below, on the report's time axis (seconds since ``RunData.t0``, the first
measurement, as the timelines).

Engine row, from ``engine_requests.parquet`` joined by ``requests.parquet``'s
``engine_request_id``, and client row, from ``requests.parquet`` and the raw records: the spans
of ``harness.analysis._spans`` (the same the run's OpenTelemetry traces hold), with a "KV freed"
mark on the engine row and a mark where the client saw a cut (``t_cut_seen``, ``cut_kind``).

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
from dataclasses import dataclass, field

import pandas as pd

from harness.analysis import client_spans, engine_spans
from harness.analysis import finite as _t
from harness.analysis import sorted_times as _times
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
    "connect": ("connecting", "#bdbdbd"),
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
