"""Run tables: records, chunks, server metrics and socket samples as pandas DataFrames.

The run folder keeps them as Parquet (``requests.parquet``, ``chunks.parquet``,
``server_metrics.parquet``, ``sockets.parquet``); ``results/README.md`` lists their columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from harness._stats import tpot
from loadgen._records import RequestRecord, read_records

REQUEST_COLUMNS = [
    "request_id", "group", "user_class", "network_profile", "endpoint", "outcome",
    "http_status", "error", "finish_reason", "client_addr", "client_port",
    "t_send", "t_send_wall", "t_first_byte", "t_first_token", "t_last_byte", "t_end",
    "ttft_ms", "e2e_ms", "tpot_ms", "max_tokens", "prompt_tokens_requested", "prompt_tokens",
    "completion_tokens", "bytes_received", "n_chunks", "stall_s",
    "action", "t_action", "t_stall", "t_cut_seen", "cut_kind", "stall_to_cut_ms",
    "server_send_q_peak_bytes",
]  # fmt: skip
CHUNK_COLUMNS = ["request_id", "group", "index", "t", "tokens", "bytes", "gap_ms"]


def load_records(paths: Iterable[Path]) -> list[RequestRecord]:
    """Read every record of the given JSON-lines files (missing files are skipped)."""
    records: list[RequestRecord] = []
    for path in paths:
        if path.exists():
            records.extend(read_records(path))
    return records


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
    did). ``server_send_q_peak_bytes`` is the largest Send-Q the
    server's socket for that client address and port showed, or NaN when no sample matched."""
    rows: list[dict[str, Any]] = []
    for r in records:
        token_times = [c.t for c in r.chunks if c.tokens > 0]
        last_token = token_times[-1] if token_times else None
        row = {k: getattr(r, k, None) for k in REQUEST_COLUMNS if hasattr(r, k)}
        row.update(
            ttft_ms=_ms(r.t_send, r.t_first_token),
            e2e_ms=_ms(r.t_send, r.t_end or r.t_last_byte),
            tpot_ms=(
                None
                if r.t_first_token is None or last_token is None
                else (tpot(r.t_first_token, last_token, r.completion_tokens) or float("nan"))
                * 1000.0
            ),
            n_chunks=len(r.chunks),
            stall_s=_stall_s(r),
            t_stall=(t_stall := _stall_onset(r)),
            stall_to_cut_ms=_ms(t_stall, r.t_cut_seen),
        )
        rows.append(row)
    frame = pd.DataFrame(
        rows, columns=[c for c in REQUEST_COLUMNS if c != "server_send_q_peak_bytes"]
    )
    for col in ("t_action", "t_stall", "t_cut_seen", "stall_to_cut_ms"):
        frame[col] = frame[col].astype(float)
    if len(sockets) and len(frame):
        peaks = (
            sockets.groupby(["client_addr", "client_port"])["send_q_bytes"]
            .max()
            .rename("server_send_q_peak_bytes")
            .reset_index()
        )
        frame = frame.merge(peaks, on=["client_addr", "client_port"], how="left")
    else:
        frame["server_send_q_peak_bytes"] = float("nan")
    return frame[REQUEST_COLUMNS]


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


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as Parquet (pyarrow engine, no index)."""
    frame.to_parquet(path, engine="pyarrow", index=False)
