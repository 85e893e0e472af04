"""Reading a run folder for the report and the comparison, and the series they plot.

Every ``t`` of a run folder is CLOCK_MONOTONIC seconds (``docs/run-folder.md``); the report
plots seconds since the first measurement (the first scrape, socket sample or request).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from harness.analysis import per_token_itl_s
from harness.runfolder import (
    ENGINE_REQUESTS,
    ENGINE_STEPS,
    GATES_JSON,
    RUN_JSON,
    SUMMARY_JSON,
    read_json,
    read_parquet,
    run_records,
)
from loadgen import RequestRecord
from zwcore import RunFolderError

TABLES = ("requests", "chunks", "server_metrics", "sockets", "proxy")


class ReportError(RunFolderError):
    """A run folder that cannot be read; the message names the folder or file and why."""


@dataclass
class RunData:
    """One run folder, read. Frames have the columns listed in ``docs/run-folder.md``; a
    table that is missing from the folder is an empty frame. ``t0`` (monotonic s) is the
    origin of the report's time axis: the first scrape, socket sample or request.
    ``engine_requests`` and ``engine_steps`` are the engine's own tables (empty for a
    scrape-only target); ``engine_error`` says why they could not be read (the report then
    goes without them)."""

    run_dir: Path
    info: dict[str, Any]
    summary: dict[str, Any]
    requests: pd.DataFrame
    chunks: pd.DataFrame
    metrics: pd.DataFrame
    sockets: pd.DataFrame
    records: list[RequestRecord] = field(default_factory=list)
    gates: dict[str, Any] = field(default_factory=dict)  # gates.json, when the run had gates
    t0: float = 0.0
    engine_requests: pd.DataFrame = field(default_factory=pd.DataFrame)
    engine_steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    engine_error: str | None = None
    proxy: pd.DataFrame = field(default_factory=pd.DataFrame)  # proxy.parquet: hops' samples

    @property
    def label(self) -> str:
        """``<scenario>/<run folder name>``, e.g. ``sim-coupled/20261130T042413Z``."""
        return f"{self.summary.get('scenario', self.run_dir.parent.name)}/{self.run_dir.name}"


def _read_records(run_dir: Path) -> list[RequestRecord]:
    try:
        return run_records(run_dir)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ReportError(f"{run_dir}: cannot read records: {exc}") from None


def load_run(run_dir: Path, *, with_records: bool = True) -> RunData:
    """Read ``run_dir`` (``summary.json`` required; ``run.json``, ``gates.json``, tables and
    records when present; records and ``engine_requests.parquet`` only ``with_records``).
    Raises :class:`ReportError` for a missing folder or ``summary.json``, or a file that cannot
    be parsed (except ``engine_requests.parquet``: see ``RunData.engine_error``)."""
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir}: not a folder")
    try:
        summary = read_json(run_dir / SUMMARY_JSON)
        info = read_json(run_dir / RUN_JSON) if (run_dir / RUN_JSON).exists() else {}
        gates = read_json(run_dir / GATES_JSON) if (run_dir / GATES_JSON).exists() else {}
        frames = {name: read_parquet(run_dir / f"{name}.parquet") for name in TABLES}
    except RunFolderError as exc:
        raise ReportError(str(exc)) from None
    data = RunData(
        run_dir=run_dir,
        info=info,
        summary=summary,
        requests=frames["requests"],
        chunks=frames["chunks"],
        metrics=frames["server_metrics"],
        sockets=frames["sockets"],
        records=_read_records(run_dir) if with_records else [],
        gates=gates,
        proxy=frames["proxy"],
    )
    if with_records:  # the comparison needs neither
        try:
            data.engine_requests = read_parquet(run_dir / ENGINE_REQUESTS)
            data.engine_steps = read_parquet(run_dir / ENGINE_STEPS)
        except RunFolderError as exc:  # e.g. a damaged part of a killed run
            data.engine_error = str(exc)
    data.t0 = _origin(data)
    return data


def _origin(data: RunData) -> float:
    """The first sample or request: the target's start-up (over a minute for vLLM) is left
    out of the time axis; ``run_start_s`` tells how long it took."""
    firsts = [f["t"].min() for f in (data.metrics, data.sockets) if "t" in f]
    if "t_send" in data.requests:
        firsts.append(data.requests["t_send"].min())
    firsts = [float(t) for t in firsts if pd.notna(t)]
    if firsts:
        return min(firsts)
    return run_start(data) or 0.0


def run_start(data: RunData) -> float | None:
    """When the run started (monotonic s, ``run.json`` ``clock.monotonic_at_start_s``)."""
    start = data.info.get("clock", {}).get("monotonic_at_start_s")
    return float(start) if isinstance(start, int | float) else None


# -- series --------------------------------------------------------------------------------


def user_classes(data: RunData) -> list[str]:
    """User classes in the order of their first request."""
    if "user_class" not in data.requests or data.requests.empty:
        return []
    ordered = data.requests.sort_values("t_send")["user_class"].dropna().astype(str)
    return list(dict.fromkeys(ordered))


def ok_metrics(data: RunData) -> pd.DataFrame:
    """Successful scrapes, sorted by time, with ``s`` (seconds since ``t0``) added."""
    m = data.metrics
    if m.empty or "t" not in m:
        return pd.DataFrame({"s": pd.Series(dtype=float)})
    if "scrape_ok" in m:
        m = m[m["scrape_ok"].astype(bool)]
    m = m.sort_values("t").copy()
    m["s"] = m["t"] - data.t0
    return m


def engine_steps(data: RunData) -> pd.DataFrame:
    """The engine's steps, sorted by time, with ``s`` (seconds since ``t0``) added; empty
    when the engine wrote none."""
    steps = data.engine_steps
    if steps.empty or "t" not in steps:
        return pd.DataFrame({"s": pd.Series(dtype=float)})
    steps = steps.sort_values("t").copy()
    steps["s"] = steps["t"] - data.t0
    return steps


def preemptions_per_s(metrics: pd.DataFrame) -> pd.Series | None:
    """Rate of ``num_preemptions_total`` between scrapes (1/s, never negative), indexed like
    ``metrics``; ``None`` when the server lacks the counter."""
    if "num_preemptions_total" not in metrics or metrics.empty:
        return None
    rate = metrics["num_preemptions_total"].diff() / metrics["t"].diff()
    return rate.clip(lower=0).fillna(0.0)


def bin_width_s(data: RunData) -> float:
    """Width of the throughput bins: 0.5 s, or wider for long runs (at most ~150 bins)."""
    duration = float(data.summary.get("duration_s") or 0.0)
    return max(0.5, float(np.ceil(duration / 150.0 * 2) / 2))


def tokens_per_s(data: RunData) -> dict[str, pd.Series]:
    """Output tokens per second received by each user class, in bins of :func:`bin_width_s`;
    each series is indexed by the bin start (s since ``t0``)."""
    ch, req = data.chunks, data.requests
    if ch.empty or req.empty or "tokens" not in ch:
        return {}
    classes = req.set_index("request_id")["user_class"].astype(str)
    ch = ch[ch["tokens"] > 0]
    width = bin_width_s(data)
    s = ch["t"] - data.t0
    end = float(s.max()) if len(s) else 0.0
    edges = np.arange(0.0, end + 2 * width, width)
    out: dict[str, pd.Series] = {}
    cls = ch["request_id"].map(classes)
    for name in user_classes(data):
        mask = cls == name
        counts, _ = np.histogram(s[mask], bins=edges, weights=ch.loc[mask, "tokens"])
        out[name] = pd.Series(counts / width, index=edges[:-1])
    return out


def load_sockets(data: RunData) -> pd.DataFrame:
    """Socket samples of the load's own connections (on the client-facing port, client port
    seen in ``requests``), with
    ``s`` (s since ``t0``) and ``conn`` (``group:port``) added."""
    so, req = data.sockets, data.requests
    if so.empty or req.empty or "client_port" not in so:
        return pd.DataFrame()
    # Only the port the clients connect to (the proxy's, if any); run.json before this field
    # existed has one port only.
    port = data.info.get("client_facing_port")
    if port is not None and "local_port" in so:
        so = so[so["local_port"] == port]
    groups = req.dropna(subset=["client_port"]).drop_duplicates("client_port", keep="last")
    group_of = groups.set_index("client_port")["group"].astype(str)
    so = so[so["client_port"].isin(group_of.index)].copy()
    so["s"] = so["t"] - data.t0
    so["conn"] = so["client_port"].map(group_of) + ":" + so["client_port"].astype(int).astype(str)
    return so.sort_values("t")


def hop_samples(data: RunData) -> dict[str, pd.DataFrame]:
    """The proxy probe's samples (``proxy.parquet``) per hop, sorted by time with ``s`` (seconds
    since ``t0``) added, by the label ``hop <index> <kind>`` (the kinds from ``summary.json``
    ``proxy.hops``, else the proxy's own kind: a run folder written before every hop was probed,
    whose samples have no ``hop`` column and are hop 0's); empty without a proxy."""
    frame = data.proxy
    if frame.empty or "t" not in frame:
        return {}
    proxy = data.summary.get("proxy") or {}
    kinds = {int(h["index"]): str(h["kind"]) for h in proxy.get("hops") or []}
    hop = frame["hop"] if "hop" in frame else pd.Series(0, index=frame.index)
    out = {}
    for index in sorted({int(i) for i in hop}):
        rows = frame[hop == index].sort_values("t").copy()
        rows["s"] = rows["t"] - data.t0
        kind = kinds.get(index, str(proxy.get("kind", "proxy")) if index == 0 else "?")
        out[f"hop {index} {kind}"] = rows
    return out


def slowest_connections(sockets: pd.DataFrame, n: int = 5) -> list[str]:
    """The ``n`` connections (``conn`` labels) with the largest peak Send-Q, largest first;
    only connections that ever held bytes."""
    if sockets.empty:
        return []
    peaks = sockets.groupby("conn")["send_q_bytes"].max().sort_values(ascending=False)
    return [str(c) for c in peaks[peaks > 0].index[:n]]


def rwnd_column(sockets: pd.DataFrame) -> str | None:
    """The first numeric socket column whose name starts with ``rwnd_limited`` (e.g.
    ``rwnd_limited_ms``, time the sender was limited by the receive window), or ``None``."""
    for col in sockets.columns:
        if str(col).startswith("rwnd_limited") and pd.api.types.is_numeric_dtype(sockets[col]):
            return str(col)
    return None


@dataclass(frozen=True)
class Event:
    """A marker on the time axis: ``kind`` is ``phase``, ``stall``, ``abort`` or ``cut``
    (RST or EOF from the peer, or an RST the client sent); ``s`` seconds since ``t0``."""

    kind: str
    s: float
    text: str


def rst_groups(data: RunData) -> set[str]:
    """Groups whose clients end with RST (``abortive_close``, or ``stop_reading`` with
    ``close = "rst"``), from the scenario in ``run.json``."""
    out = set()
    for g in (data.info.get("scenario") or {}).get("groups") or []:
        action = g.get("action") or {}
        if action.get("kind") == "abortive_close" or action.get("close") == "rst":
            out.add(str(g.get("name")))
    return out


def events(data: RunData) -> list[Event]:
    """Phase changes (a user group's first request, generation end of the KV verdict),
    stall onsets (raw records), client aborts, RSTs the clients sent, and cuts by the peer
    (EOF or RST before ``[DONE]``)."""
    out: list[Event] = []
    req = data.requests
    rst = rst_groups(data)
    if not req.empty:
        for group, first in req.groupby("group")["t_send"].min().sort_values().items():
            out.append(Event("phase", float(first) - data.t0, f"group {group} starts"))
        ended = req.dropna(subset=["t_end"])
        columns = (ended["group"], ended["outcome"], ended["t_end"])
        for group, outcome, t_end in zip(*columns, strict=True):
            s = float(t_end) - data.t0
            if outcome == "client_abort" and group in rst:
                out.append(Event("cut", s, f"{group}: client sent RST"))
            elif outcome == "client_abort":
                out.append(Event("abort", s, f"{group}: client abort"))
            elif outcome == "cut_by_peer":
                out.append(Event("cut", s, f"{group}: cut by peer (EOF/RST)"))
    for rec in data.records:
        for start, _ in rec.stalls:
            if start is not None:
                out.append(Event("stall", start - data.t0, f"{rec.group}: stall ({rec.action})"))
    verdict = data.summary.get("verdicts", {}).get("kv_held_by_undelivered_streams", {})
    t_gen = verdict.get("t_generation_end") if isinstance(verdict, dict) else None
    if isinstance(t_gen, int | float):
        out.append(Event("phase", float(t_gen) - data.t0, "generation ended (KV verdict)"))
    return sorted(out, key=lambda e: e.s)


def ttft_ms(data: RunData, user_class: str) -> np.ndarray:
    """TTFT (ms) of the class's requests that got a first token."""
    req = data.requests
    if req.empty:
        return np.array([])
    return req.loc[req["user_class"].astype(str) == user_class, "ttft_ms"].dropna().to_numpy()


def itl_ms(data: RunData, user_class: str) -> np.ndarray:
    """Per-token ITL (ms) of the class's streams (``harness.analysis.per_token_itl_s``)."""
    req, ch = data.requests, data.chunks
    if req.empty or ch.empty:
        return np.array([])
    ids = set(req.loc[req["user_class"].astype(str) == user_class, "request_id"])
    return per_token_itl_s(ch[ch["request_id"].isin(ids)]) * 1000.0


def cdf(values: np.ndarray, max_points: int = 2000) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF of ``values`` as (x, fraction ≤ x); more than ``max_points`` values are
    reduced to that many evenly spaced quantiles."""
    x = np.sort(np.asarray(values, dtype=float))
    x = x[~np.isnan(x)]
    if x.size == 0:
        return x, x
    if x.size <= max_points:
        return x, np.arange(1, x.size + 1) / x.size
    p = np.linspace(0.0, 1.0, max_points)
    return np.quantile(x, p), p
