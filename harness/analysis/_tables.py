"""Run tables: records, chunks, server metrics and socket samples as pandas DataFrames.

The run folder keeps them as Parquet (``requests.parquet``, ``chunks.parquet``,
``server_metrics.parquet``, ``sockets.parquet``); ``docs/run-folder.md`` lists their columns.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.analysis._latency import tpot
from loadgen import RequestRecord

REQUEST_COLUMNS = [
    "request_id", "group", "user_class", "network_profile", "endpoint", "stream", "outcome",
    "http_status", "error", "finish_reason", "client_addr", "client_port",
    "t_send", "t_send_wall", "t_first_byte", "t_first_token", "t_last_byte", "t_end",
    "ttft_ms", "e2e_ms", "tpot_ms", "max_tokens", "prompt_tokens_requested", "prompt_tokens",
    "completion_tokens", "bytes_received", "n_chunks", "stall_s",
    "action", "t_action", "t_stall", "t_cut_seen", "cut_kind", "stall_to_cut_ms",
    "server_send_q_peak_bytes", "server_rwnd_limited_ms", "server_sndbuf_limited_ms",
    "server_retransmits", "stream_id", "timestamps", "read_lag_max_ms",
    "t_scheduled", "schedule_index", "send_lag_ms", "ttft_from_scheduled_ms",
    "e2e_from_scheduled_ms", "behaviour", "clock_bound_ms", "content_encoding",
    "t_connected", "trace_id", "span_id", "session_id", "turn", "context_tokens", "session_end",
]  # fmt: skip
# Per-request figures from the server's socket samples: column -> (sockets column, aggregate).
SERVER_SOCKET_FIGURES = {
    "server_send_q_peak_bytes": "send_q_bytes",
    "server_rwnd_limited_ms": "rwnd_limited_ms",
    "server_sndbuf_limited_ms": "sndbuf_limited_ms",
    "server_retransmits": "retransmits",
}
# Socket samples this long before a request's send or after its end still count as its own.
_JOIN_SLACK_S = 1.0
CHUNK_COLUMNS = ["request_id", "group", "index", "t", "tokens", "bytes", "gap_ms"]


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else (b - a) * 1000.0


def _stall_s(record: RequestRecord) -> float:
    end_default = record.t_end or record.t_last_byte
    total = 0.0
    for start, end in record.stalls:
        stop = end if end is not None else end_default
        if start is not None and stop is not None:
            total += max(0.0, stop - start)
    return total


def _stall_onset(record: RequestRecord) -> float | None:
    """When the client stopped reading: the last read (chunk time) before its first stall
    began, or the stall's start if none. The action itself fires only after that read's events
    were parsed, which on a loaded client can take hundreds of ms."""
    if not record.stalls or record.stalls[0][0] is None:
        return None
    start = record.stalls[0][0]
    before = [c.t for c in record.chunks if c.t <= start]
    return max(before) if before else start


def requests_frame(records: list[RequestRecord], sockets: pd.DataFrame) -> pd.DataFrame:
    """One row per request (columns :data:`REQUEST_COLUMNS`; times in monotonic s, latencies
    in ms). ``t_stall`` is when the client stopped reading for its first stall
    (``stall``/``stop_reading``): its last read before the stall; ``stall_to_cut_ms`` the time
    from it to ``t_cut_seen``, when the client saw the server's RST or FIN (NaN if it never
    did). The ``server_*`` columns come from the server's socket samples (``sockets``, the
    client-facing port's rows) of the same client address and port taken between the
    request's send and its end (1 s slack each side, so a reused port is not mixed up):
    the peak Send-Q, and the largest ``rwnd_limited_ms``, ``sndbuf_limited_ms`` and
    ``retransmits`` (the kernel's per-connection totals; a connection carries one request).
    NaN when no sample matched. Open loop: ``t_scheduled`` (the schedule's deadline),
    ``schedule_index`` (the request's position in the whole schedule; ``<NA>`` in a closed loop),
    ``send_lag_ms`` (``t_send`` minus it), and TTFT and end-to-end latency counted from it
    (``ttft_from_scheduled_ms``, ``e2e_from_scheduled_ms``); NaN in a closed loop.
    ``clock_bound_ms``: for a worker on another clock, how far its times may be off (NaN on the
    harness's clock; ``loadgen._clock``). Sessions: ``session_id``, ``turn`` (1-based),
    ``context_tokens`` and ``session_end`` as recorded (``<NA>``/empty outside a session)."""
    rows: list[dict[str, Any]] = []
    for r in records:
        token_times = [c.t for c in r.chunks if c.tokens > 0]
        last_token = token_times[-1] if token_times else None
        row = {k: getattr(r, k, None) for k in REQUEST_COLUMNS if hasattr(r, k)}
        row.update(
            ttft_ms=r.ttft_ms,
            e2e_ms=_ms(r.t_send, r.t_end or r.t_last_byte),
            tpot_ms=(
                None
                if r.t_first_token is None or last_token is None or not r.stream
                else (tpot(r.t_first_token, last_token, r.completion_tokens) or float("nan"))
                * 1000.0
            ),
            n_chunks=len(r.chunks),
            stall_s=_stall_s(r),
            t_stall=(t_stall := _stall_onset(r)),
            stall_to_cut_ms=_ms(t_stall, r.t_cut_seen),
            send_lag_ms=_ms(r.t_scheduled, r.t_send),
            ttft_from_scheduled_ms=_ms(r.t_scheduled, r.t_first_token),
            e2e_from_scheduled_ms=_ms(r.t_scheduled, r.t_end or r.t_last_byte),
        )
        rows.append(row)
    frame = pd.DataFrame(
        rows, columns=[c for c in REQUEST_COLUMNS if c not in SERVER_SOCKET_FIGURES]
    )
    for col in (
        "t_action", "t_stall", "t_cut_seen", "stall_to_cut_ms", "read_lag_max_ms",
        "t_scheduled", "send_lag_ms", "ttft_from_scheduled_ms", "e2e_from_scheduled_ms",
        "clock_bound_ms", "t_connected",
    ):  # fmt: skip
        frame[col] = frame[col].astype(float)
    for col in ("schedule_index", "turn", "context_tokens"):
        frame[col] = frame[col].astype("Int64")
    figures = _server_socket_figures(frame, sockets)
    frame = frame.merge(figures, on="request_id", how="left")
    return frame[REQUEST_COLUMNS]


def _server_socket_figures(frame: pd.DataFrame, sockets: pd.DataFrame) -> pd.DataFrame:
    """Per ``request_id``: the :data:`SERVER_SOCKET_FIGURES` of its connection's samples."""
    columns = ["request_id", *SERVER_SOCKET_FIGURES]
    have = [c for c in SERVER_SOCKET_FIGURES.values() if c in sockets]
    if not len(sockets) or not len(frame) or not have:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in columns}).astype(
            {"request_id": object}
        )
    reqs = frame[["request_id", "client_addr", "client_port", "t_send", "t_end"]].copy()
    reqs["t_end"] = reqs["t_end"].fillna(float("inf"))
    joined = reqs.merge(
        sockets[["t", "client_addr", "client_port", *have]], on=["client_addr", "client_port"]
    )
    inside = joined[
        (joined["t"] >= joined["t_send"] - _JOIN_SLACK_S)
        & (joined["t"] <= joined["t_end"] + _JOIN_SLACK_S)
    ]
    out = inside.groupby("request_id")[have].max(numeric_only=True)
    out = out.rename(columns={v: k for k, v in SERVER_SOCKET_FIGURES.items()}).reset_index()
    for col in SERVER_SOCKET_FIGURES:
        if col not in out:
            out[col] = float("nan")
    return out[columns]


def chunks_frame(records: list[RequestRecord]) -> pd.DataFrame:
    """One row per received chunk (columns :data:`CHUNK_COLUMNS`); ``gap_ms`` is the time since
    the previous chunk of the same request (since the send for the first)."""
    rows: list[tuple[Any, ...]] = []
    for r in records:
        prev = r.t_send
        for i, c in enumerate(r.chunks):
            rows.append((r.request_id, r.group, i, c.t, c.tokens, c.bytes, (c.t - prev) * 1000.0))
            prev = c.t
    return pd.DataFrame(rows, columns=CHUNK_COLUMNS)
