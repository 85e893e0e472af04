"""The proxy's figures of a run, per hop: peaks of its gauges and rises of its counters, from the
samples of :class:`~harness.collectors.ProxyProbe` (``proxy.parquet``, a row per hop per sample)
and the socket samples of each hop's listening port (``sockets.parquet``).

A row's ``hop`` says which hop it sampled (0 faces the clients; a single proxy is hop 0). A
``proxy.parquet`` written before every hop was probed has no ``hop`` column: its rows are the
first hop's (the only one probed then).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from harness.runfolder import PROBE_COLUMNS, HopSummary, ProxySummary, hop_metric_name


def probe_rows(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """The rows of ``proxy.parquet`` as dicts without the cells no sample filled (missing or
    NaN: another hop's column, or a figure not served at that sample)."""
    rows: list[dict[str, Any]] = frame.to_dict("records")  # type: ignore[assignment]
    return [{k: v for k, v in r.items() if v is not None and not pd.isna(v)} for r in rows]


def hop_rows(rows: Iterable[dict[str, Any]], index: int) -> list[dict[str, Any]]:
    """The rows of hop ``index`` (a row without ``hop`` is hop 0's)."""
    return [r for r in rows if int(r.get("hop", 0)) == index]


def _peak(rows: list[dict[str, Any]], key: str) -> int | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return int(max(values)) if values else None


def counter_rise(rows: list[dict[str, Any]], key: str) -> float | None:
    """The rise of counter ``key`` from the first sample to the last: ``None`` when no row has
    it. A row whose metrics answered (``metrics_ok``) without it counts 0: a Prometheus client
    exports a labelled counter's series only once it has counted."""
    if not any(key in r for r in rows):
        return None
    values = [r[key] if key in r else 0.0 for r in rows if key in r or r.get("metrics_ok")]
    return float(values[-1] - values[0])


def proxy_summary(name: str, kind: str, rows: list[dict[str, Any]]) -> ProxySummary:
    """Summarize the first hop's rows (:func:`probe_rows`, :func:`hop_rows`) of a
    :class:`~harness.collectors.ProxyProbe`: peaks of the gauges, rises of the counters, and for
    ``egress`` its cuts, upstream aborts and the mean of the per-stream peak buffered bytes (the
    rise of the ``zerowindow_egress_stream_peak_buffered_bytes`` histogram's ``_sum`` over its
    ``_count``)."""
    mean = None
    peak_sum = counter_rise(rows, "stream_peak_sum")
    peak_count = counter_rise(rows, "stream_peak_count")
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
        cuts=counter_rise(rows, "cuts"),
        upstream_aborts=counter_rise(rows, "upstream_aborts"),
        samples=len(rows),
        cut_reasons={
            key.removeprefix("cuts_"): rise
            for key in sorted({k for r in rows for k in r if k.startswith("cuts_")})
            if (rise := counter_rise(rows, key))
        },
    )


def metric_figures(rows: list[dict[str, Any]], declared: list[dict[str, Any]]) -> dict[str, float]:
    """A hop's own metric figures from its ``rows``, by its declaration ``declared``
    (``ProxyFigure.describe`` each): a counter's rise over the run as ``<figure>`` (and
    ``<figure>_<value>`` per value of its ``by_label``), a gauge's peak as ``<figure>_peak``;
    figures no row has are left out, and so is a figure the probe reports as its own
    (``buffered_bytes``: the hop's ``buffered_peak_bytes``)."""
    columns = sorted({k for r in rows for k in r} - PROBE_COLUMNS)
    out: dict[str, float] = {}
    for d in declared:
        figure = d["figure"]
        names = [figure] if figure in columns else []
        if d.get("by_label"):
            names += [c for c in columns if c.startswith(f"{figure}_")]
        for name in names:
            if d["type"] == "counter":
                out[hop_metric_name(name, "counter")] = counter_rise(rows, name) or 0.0
            else:
                out[hop_metric_name(name, "gauge")] = float(max(r[name] for r in rows if name in r))
    return out


def _send_q_peak(sockets: pd.DataFrame, port: int) -> tuple[int | None, int]:
    """(peak over sample times of the Send-Q summed over ``port``'s connections, sample times
    that saw the port) from ``sockets.parquet``."""
    rows = sockets[sockets["local_port"] == port] if len(sockets) else sockets
    per_t = rows.groupby("t")["send_q_bytes"].sum() if len(rows) else None
    if per_t is None or not len(per_t):
        return None, 0
    return int(per_t.max()), len(per_t)


def hop_summaries(
    sockets: pd.DataFrame, hops: list[dict[str, Any]], rows: list[dict[str, Any]]
) -> list[HopSummary]:
    """Per hop (``hops``: ``run.json``'s ``proxy_hops``, each with ``kind``, ``port`` and,
    since every hop is probed, ``index`` and ``metric_figures``; from the clients' side
    inward): its port's summed Send-Q in ``sockets`` (``sockets.parquet``) and its probe
    ``rows`` (:func:`probe_rows`) summarized."""
    out = []
    for i, hop in enumerate(hops):
        index = int(hop.get("index", i))
        mine = hop_rows(rows, index)
        send_q, samples = _send_q_peak(sockets, hop["port"])
        out.append(
            HopSummary(
                index=index, kind=hop["kind"], port=hop["port"], send_q_peak_bytes=send_q,
                samples=samples, rss_peak_bytes=_peak(mine, "rss_bytes"),
                buffered_peak_bytes=_peak(mine, "buffered_bytes"),
                client_send_q_peak_bytes=_peak(mine, "client_send_q_bytes"),
                upstream_recv_q_peak_bytes=_peak(mine, "upstream_recv_q_bytes"),
                probe_samples=len(mine),
                metrics=metric_figures(mine, hop.get("metric_figures", [])),
            )
        )  # fmt: skip
    return out
