"""The proxy's figures of a run: peaks of its gauges and rises of its counters, from the
samples of :class:`~harness.collectors.ProxyProbe` (``proxy.parquet``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.runfolder import HopSummary, ProxySummary


def _peak(rows: list[dict[str, Any]], key: str) -> int | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return int(max(values)) if values else None


def _rise(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return float(values[-1] - values[0]) if values else None


def proxy_summary(name: str, kind: str, rows: list[dict[str, Any]]) -> ProxySummary:
    """Summarize a :class:`~harness.collectors.ProxyProbe`'s rows (peaks of the gauges, rises
    of the counters); a value that is missing or NaN (a table cell no sample filled) counts as
    not sampled."""
    rows = [{k: v for k, v in r.items() if v is not None and not pd.isna(v)} for r in rows]
    mean = None
    peak_sum, peak_count = _rise(rows, "stream_peak_sum"), _rise(rows, "stream_peak_count")
    if peak_sum is not None and peak_count:
        mean = peak_sum / peak_count
    has_process = kind != "none"
    return ProxySummary(
        name=name,
        kind=kind,
        rss_peak_bytes=_peak(rows, "rss_bytes"),
        buffered_peak_bytes=_peak(rows, "buffered_bytes"),
        stream_buffered_peak_mean_bytes=mean,
        client_send_q_peak_bytes=_peak(rows, "client_send_q_bytes") if has_process else None,
        upstream_recv_q_peak_bytes=_peak(rows, "upstream_recv_q_bytes") if has_process else None,
        cuts=_rise(rows, "cuts"),
        upstream_aborts=_rise(rows, "upstream_aborts"),
        samples=len(rows),
        cut_reasons={
            key.removeprefix("cuts_"): rise
            for key in sorted({k for r in rows for k in r if k.startswith("cuts_")})
            if (rise := _rise(rows, key))
        },
    )


def hop_summaries(sockets: pd.DataFrame, hops: list[dict[str, Any]]) -> list[HopSummary]:
    """Per hop of a chain (``hops``: ``{"kind", "port"}`` from the clients' side inward): the
    peak over sample times of its port's summed Send-Q in ``sockets`` (``sockets.parquet``)."""
    out = []
    for i, hop in enumerate(hops):
        rows = sockets[sockets["local_port"] == hop["port"]] if len(sockets) else sockets
        per_t = rows.groupby("t")["send_q_bytes"].sum() if len(rows) else None
        peak = None if per_t is None or not len(per_t) else int(per_t.max())
        samples = 0 if per_t is None else len(per_t)
        out.append(HopSummary(index=i, kind=hop["kind"], port=hop["port"],
                              send_q_peak_bytes=peak, samples=samples))  # fmt: skip
    return out
