"""The per-request join as OpenTelemetry spans: one trace per request, in the request's own
trace (the W3C ``traceparent`` its client sent, ``requests.parquet`` ``trace_id`` and
``span_id``), so that the spans of a server that traces (vLLM's ``llm_request``, with
``--otlp-traces-endpoint``) land in the same trace, under the client's span.

Each request's trace holds the client's root span (``request``, kind CLIENT, the span id its
``traceparent`` named; status ERROR for an outcome that is a failure), its children ``client
connect``, ``client waiting`` (for the first token), ``client receiving``, ``client stalled``
(``harness.analysis._spans``) and ``client cut`` (from ``t_cut_seen``: the client saw the
server end the stream; to the request's end), and, where the engine wrote its table and the
request joined a row of it, ``engine request`` (arrival to KV freed) with its children
``engine queued``, ``engine prefill``, ``engine decode``, ``engine preempted``, ``engine send
blocked`` and ``engine KV held``. Times are moved from CLOCK_MONOTONIC onto the wall clock
(Unix ns, what OTLP and vLLM's spans carry) by the run's one offset (``run.json`` ``clock``).
Span ids other than the root's are derived from the trace id, the name and the position
(BLAKE2b), so that analysing a folder again reproduces the file.

:func:`otlp_json` writes the spans as the OTLP/JSON encoding of an ExportTraceServiceRequest
(https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding: lowerCamelCase keys, trace
and span ids as hex, 64-bit integers as decimal strings, enums as integers).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from harness.analysis._spans import client_spans, engine_spans, finite

SPAN_KIND = {"internal": 1, "server": 2, "client": 3}
"""OTLP ``Span.SpanKind`` values (opentelemetry/proto/trace/v1/trace.proto)."""
STATUS_ERROR = 2  # ``Status.StatusCode.STATUS_CODE_ERROR``
FAILED_OUTCOMES = frozenset(
    {"http_error", "server_error_event", "not_sse", "cut_by_peer", "timeout"}
)
"""Outcomes whose root span has status ERROR: every one but ``complete`` and the client's own
``client_abort``."""
SCOPE = "zerowindow"
_ATTRIBUTES = {  # requests.parquet column -> attribute of the root span
    "request_id": "zerowindow.request_id",
    "group": "zerowindow.group",
    "behaviour": "zerowindow.behaviour",
    "outcome": "zerowindow.outcome",
    "action": "zerowindow.action",
    "http_status": "http.response.status_code",
    "endpoint": "zerowindow.endpoint",
    "max_tokens": "gen_ai.request.max_tokens",
    "completion_tokens": "gen_ai.usage.completion_tokens",
    "bytes_received": "zerowindow.bytes_received",
    "ttft_ms": "zerowindow.ttft_ms",
    "e2e_ms": "zerowindow.e2e_ms",
    "stream_id": "zerowindow.stream_id",
    "engine_request_id": "gen_ai.request.id",
    "delivery_lag_ms": "zerowindow.delivery_lag_ms",
    "undelivered_tokens_at_kv_free": "zerowindow.undelivered_tokens_at_kv_free",
}
_ENGINE_ATTRIBUTES = {
    "engine_request_id": "gen_ai.request.id",
    "finish_reason": "zerowindow.engine.finish_reason",
    "prompt_tokens": "gen_ai.usage.prompt_tokens",
    "output_tokens": "gen_ai.usage.completion_tokens",
    "kv_blocks_peak": "zerowindow.engine.kv_blocks_peak",
    "kv_blocks_freed": "zerowindow.engine.kv_blocks_freed",
}
_ENGINE_NAMES = {"kv_held": "KV held", "send_blocked": "send blocked"}


@dataclass(frozen=True)
class TraceSpan:
    """One span: ``trace_id`` (32 hex digits), ``span_id`` (16), ``parent_span_id`` (16, or
    ``None`` for a root), ``kind`` (a key of :data:`SPAN_KIND`), ``start_ns`` and ``end_ns``
    (Unix ns), ``attributes`` (str, int, float or bool values) and ``error`` (the message of
    status ERROR; ``None``: status unset)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    kind: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def child_span_id(trace_id: str, name: str, index: int) -> str:
    """A span id (16 hex digits, never all zero) derived from its trace, name and position."""
    digest = hashlib.blake2b(f"{trace_id}/{name}/{index}".encode(), digest_size=8).hexdigest()
    return digest if int(digest, 16) else "0000000000000001"


def wall_offset_s(requests: pd.DataFrame, recorded: float | None) -> float:
    """Seconds to add to a monotonic time to get Unix time: ``recorded`` (``run.json``'s
    ``clock``: wall minus monotonic at the run's start), else the median over the requests of
    ``t_send_wall - t_send`` (0 without requests)."""
    if recorded is not None:
        return recorded
    if not len(requests) or "t_send_wall" not in requests:
        return 0.0
    offset = (requests["t_send_wall"] - requests["t_send"]).median()
    return 0.0 if pd.isna(offset) else float(offset)


def _value(v: Any) -> Any:
    """``v`` as an attribute value, ``None`` for null or NaN."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA:
        return None
    if hasattr(v, "item"):  # numpy scalars
        v = v.item()
    return v if isinstance(v, str | int | float | bool) else str(v)


def _attributes(row: Any, names: dict[str, str]) -> dict[str, Any]:
    values = ((attr, _value(row.get(col))) for col, attr in names.items())
    return {attr: v for attr, v in values if v is not None}


def request_spans(
    row: dict[Any, Any],
    engine: dict[Any, Any] | None,
    stalls: Sequence[Sequence[float | None]] | None,
    offset_s: float,
) -> list[TraceSpan]:
    """The spans of one request (module docstring): ``row`` of ``requests.parquet``,
    ``engine`` its joined row of ``engine_requests.parquet`` (``None``: none), ``stalls`` its
    record's stall pairs (``None`` without records), ``offset_s`` from :func:`wall_offset_s`.
    ``[]`` for a row without a ``trace_id`` (a folder written before requests carried one)."""
    trace, root = row.get("trace_id"), row.get("span_id")
    send = finite(row.get("t_send"))
    if not isinstance(trace, str) or not isinstance(root, str) or send is None:
        return []

    offset_ns = round(offset_s * 1e9)  # apart: a Unix time in ns is beyond a float's 53 bits

    def ns(t: float) -> int:
        return round(t * 1e9) + offset_ns

    def child(name: str, kind: str, a: float, b: float, parent: str, i: int, **attrs: Any):
        return TraceSpan(trace, child_span_id(trace, name, i), parent, name, kind, ns(a), ns(b),
                         {k: v for k, v in attrs.items() if v is not None})  # fmt: skip

    client = client_spans(row, stalls)
    cut = finite(row.get("t_cut_seen"))
    ends = [b for _, _, b in client] + [
        t for c in ("t_end", "t_last_byte") if (t := finite(row.get(c))) is not None
    ]
    end = max([send, *ends] + ([cut] if cut is not None else []))
    outcome = row.get("outcome")
    error = None
    if outcome in FAILED_OUTCOMES:
        error = f"{outcome}: {row.get('error')}" if _value(row.get("error")) else str(outcome)
    out = [TraceSpan(trace, root, None, "request", "client", ns(send), ns(end),
                     _attributes(row, _ATTRIBUTES), error)]  # fmt: skip
    for i, (kind, a, b) in enumerate(client):
        out.append(child(f"client {kind}", "internal", a, b, root, i))
    if cut is not None:
        kind = _value(row.get("cut_kind"))
        out.append(child("client cut", "internal", cut, max(cut, end), root, 0,
                         **{"zerowindow.cut_kind": kind}))  # fmt: skip
    if engine is not None:
        out += _engine_spans(engine, child, root)
    return out


def _engine_spans(engine: dict[Any, Any], child: Any, root: str) -> list[TraceSpan]:
    """``engine request`` (under the client's root span) and its phases."""
    phases = engine_spans(engine)
    times = [t for c in ("t_arrival", "t_kv_freed", "t_generation_end")
             if (t := finite(engine.get(c))) is not None]  # fmt: skip
    times += [t for _, a, b in phases for t in (a, b)]
    if not times:
        return []
    top = child("engine request", "internal", min(times), max(times), root, 0,
                **_attributes(engine, _ENGINE_ATTRIBUTES))  # fmt: skip
    out = [top]
    for i, (kind, a, b) in enumerate(phases):
        out.append(child(f"engine {_ENGINE_NAMES.get(kind, kind)}", "internal", a, b,
                         top.span_id, i))  # fmt: skip
    return out


def run_spans(
    requests: pd.DataFrame,
    engine: pd.DataFrame,
    stalls: dict[str, list[list[float | None]]] | None,
    offset_s: float,
) -> list[TraceSpan]:
    """Every request's spans (:func:`request_spans`): ``requests`` as ``requests.parquet``
    holds it (joined with the engine), ``engine`` the ``engine_requests.parquet`` table (empty:
    no engine spans), ``stalls`` the records' stall pairs by request id."""
    rows: dict[str, dict[Any, Any]] = {}
    if len(engine) and "engine_request_id" in engine and "engine_request_id" in requests:
        table = engine.drop_duplicates("engine_request_id", keep="last")
        rows = {str(r["engine_request_id"]): r for r in table.to_dict("records")}
    out: list[TraceSpan] = []
    for row in requests.to_dict("records"):
        eid = row.get("engine_request_id")
        match = rows.get(eid) if isinstance(eid, str) else None
        rec = stalls.get(row["request_id"]) if stalls is not None else None
        out += request_spans(row, match, rec, offset_s)
    return out


def _any_value(v: Any) -> dict[str, Any]:
    """An OTLP ``AnyValue`` in the JSON mapping (int64 as a decimal string)."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    return {"stringValue": str(v)}


def _key_values(attributes: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attributes.items()]


def _span_json(span: TraceSpan) -> dict[str, Any]:
    out: dict[str, Any] = {
        "traceId": span.trace_id,
        "spanId": span.span_id,
        "name": span.name,
        "kind": SPAN_KIND[span.kind],
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": _key_values(span.attributes),
    }
    if span.parent_span_id is not None:
        out["parentSpanId"] = span.parent_span_id
    if span.error is not None:
        out["status"] = {"code": STATUS_ERROR, "message": span.error}
    return out


def otlp_json(spans: Sequence[TraceSpan], resource: dict[str, Any], version: str) -> dict[str, Any]:
    """``spans`` as one ExportTraceServiceRequest in the OTLP/JSON encoding (module
    docstring): one ``resourceSpans`` with ``resource``'s attributes, one ``scopeSpans`` of
    scope ``zerowindow`` ``version``."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _key_values(resource)},
                "scopeSpans": [
                    {
                        "scope": {"name": SCOPE, "version": version},
                        "spans": [_span_json(s) for s in spans],
                    }
                ],
            }
        ]
    }
