"""Analysis: a pure function of a run folder.

:func:`analyze` reads what a run measured (the load processes' records and saturation samples,
the scrapes of the server's ``/metrics``, the socket and proxy samples) and what its life cycle
recorded in ``run.json`` (:class:`RunFacts`), and returns the per-request and per-chunk tables
and the summary. It writes nothing: :func:`write_analysis` does, so that ``zerowindow analyze
RUN_DIR`` re-runs it on any run folder, on any machine, and reproduces ``summary.json``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pandas as pd

from harness.analysis._accelerator import accelerator_summary
from harness.analysis._engine import (
    combine_verdicts,
    engine_server_figures,
    kv_held_from_requests,
    probe_problem,
)
from harness.analysis._engine_join import engine_aborts, join_engine, send_blocked_spans
from harness.analysis._killed import killed_run_end
from harness.analysis._leaves import leave_figures
from harness.analysis._matrix import matrix_cells
from harness.analysis._otlp import TraceSpan, otlp_json, run_spans, wall_offset_s
from harness.analysis._proxy import hop_rows, hop_summaries, probe_rows, proxy_summary
from harness.analysis._saturation import saturation_summary
from harness.analysis._sessions import prefix_reuse, turn_summaries
from harness.analysis._stalls import abort_times, attribute_aborts
from harness.analysis._summary import (
    group_names,
    summarize_group,
    summarize_requests,
    summarize_server,
)
from harness.analysis._tables import chunks_frame, requests_frame
from harness.analysis._verdicts import engine_costs, kv_held_verdict
from harness.collectors import SOCKET_COLUMNS
from harness.runfolder import (
    ACCELERATOR,
    CHUNKS,
    ENGINE_PROBE_JSON,
    ENGINE_REQUESTS,
    ENGINE_STEPS,
    PROXY,
    REQUESTS,
    RUN_JSON,
    SERVER_METRICS,
    SOCKETS,
    SUMMARY_JSON,
    TRACES_OTLP,
    GroupSummary,
    LoadWorker,
    RunSummary,
    ServerSummary,
    kept_plugins,
    read_json,
    read_parquet,
    run_records,
    saturation_files,
    write_json,
    write_parquet,
)
from harness.scenario import Scenario
from zwcore import RunFolderError


@dataclass(frozen=True)
class RunFacts:
    """What a run's life cycle recorded that analysis needs (``run.json``).

    ``status``: ``complete``, ``failed``, ``interrupted`` or ``killed`` (the harness ended
    without its clean-up: :func:`~harness.analysis._killed.killed_run_end`), with ``failure``
    saying why;
    ``duration_s``: from the run's start to the end of its clean-up; ``proxy_name`` and
    ``proxy_kind``: the proxy configuration the load went through; ``client_port``: the port
    the clients connected to (the proxy's, if any); ``missing_metrics``: metrics the server
    never reported; ``stalled_flows``: the wire capture's stalled flows (``None`` without a
    capture); ``load_workers``: what became of each Locust worker (``--workers``); ``hops``:
    the proxy's hops as the run probed them (``ProxyHop.describe``: ``index``, ``kind``,
    ``port``, ``metric_figures`` ...; from the clients' side inward); ``accelerator``: the
    machine's GPUs, or why there are none (``harness.collectors.open_accelerator``);
    ``wall_minus_monotonic_s``: Unix time minus CLOCK_MONOTONIC at the run's start (``run.json``
    ``clock``; ``None`` in folders that lack it); ``version``: zerowindow's.
    """

    scenario: Scenario
    status: str
    failure: str | None
    duration_s: float
    proxy_name: str
    proxy_kind: str
    client_port: int | None
    missing_metrics: list[str] = field(default_factory=list)
    stalled_flows: list[dict[str, Any]] | None = None
    load_workers: list[LoadWorker] = field(default_factory=list)
    placement: dict[str, Any] | None = None  # run.json's "placement" (lifecycle._placement)
    hops: list[dict[str, Any]] = field(default_factory=list)  # run.json's "proxy_hops"
    engine_probe: dict[str, Any] | None = None  # run.json's "engine_probe"
    accelerator: dict[str, Any] | None = None  # run.json's "accelerator"
    wall_minus_monotonic_s: float | None = None
    version: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The facts as ``run.json`` keeps them (the scenario is there already)."""
        return {
            "status": self.status,
            "failure": self.failure,
            "duration_s": self.duration_s,
            "proxy_name": self.proxy_name,
            "client_facing_port": self.client_port,
            "missing_metrics": self.missing_metrics,
            "load_workers": [w.model_dump(mode="json") for w in self.load_workers],
        }


def read_facts(run_dir: Path) -> RunFacts:
    """The :class:`RunFacts` of the run folder ``run_dir``, from its ``run.json``. Folders
    written before ``run.json`` kept every fact take the missing ones from the
    ``summary.json`` the run wrote. Raises :class:`~zwcore.RunFolderError` for a folder
    without a readable ``run.json`` or scenario."""
    info = read_json(run_dir / RUN_JSON)
    old = read_json(run_dir / SUMMARY_JSON) if (run_dir / SUMMARY_JSON).exists() else {}
    try:
        recorded = dict(info["scenario"])
        recorded["plugins"] = kept_plugins(run_dir, list(recorded.get("plugins", [])))
        scenario = Scenario.model_validate(recorded)
    except (KeyError, ValueError) as exc:
        raise RunFolderError(f"{run_dir / RUN_JSON}: no valid scenario ({exc})") from None
    old_proxy = old.get("proxy") or {}
    old_server = old.get("server") or {}
    proxy = info.get("proxy") or {}
    workers = info.get("load_workers", old.get("load_workers", []))
    duration = info.get("duration_s", old.get("duration_s"))
    status = str(info.get("status", old.get("status", "failed")))
    failure = info.get("failure", old.get("failure"))
    probe = info.get("engine_probe")
    if duration is None and status == "running":  # its harness was killed before the end
        duration, failure = killed_run_end(run_dir, info, [g.name for g in scenario.groups])
        status = "killed"
        if probe is None and (run_dir / ENGINE_PROBE_JSON).exists():  # written as it started
            probe = read_json(run_dir / ENGINE_PROBE_JSON)
    if duration is None:
        raise RunFolderError(f"{run_dir / RUN_JSON}: the run did not record its duration")
    return RunFacts(
        scenario=scenario,
        status=status,
        failure=failure,
        duration_s=float(duration),
        proxy_name=str(info.get("proxy_name", old_proxy.get("name", proxy.get("kind", "none")))),
        proxy_kind=str(proxy.get("kind", old_proxy.get("kind", "none"))),
        client_port=info.get("client_facing_port"),
        missing_metrics=list(info.get("missing_metrics", old_server.get("missing_metrics", []))),
        stalled_flows=(info.get("network") or {}).get("stalled_flows"),
        load_workers=[LoadWorker.model_validate(w) for w in workers],
        placement=info.get("placement"),
        engine_probe=probe,
        hops=info.get("proxy_hops") or chain_hops(proxy),
        accelerator=info.get("accelerator"),
        wall_minus_monotonic_s=_wall_minus_monotonic(info.get("clock")),
        version=(info.get("versions") or {}).get("zerowindow"),
    )


def _wall_minus_monotonic(clock: dict[str, Any] | None) -> float | None:
    """Unix time minus CLOCK_MONOTONIC (s) from ``run.json``'s ``clock``, if it has one."""
    if not clock or clock.get("wall_at_start_s") is None:
        return None
    return float(clock["wall_at_start_s"]) - float(clock["monotonic_at_start_s"])


def chain_hops(proxy: dict[str, Any]) -> list[dict[str, Any]]:
    """The hops of a chain from its ``run.json`` description (``Proxy.describe``), each
    ``{"kind", "port"}``, from the clients' side inward; ``[]`` for any other proxy: the hops
    of a run folder written before ``run.json`` kept ``proxy_hops``."""
    return [
        {"kind": h["kind"], "port": urlsplit(h["url"]).port}
        for h in proxy.get("hops", [])
        if h.get("url")
    ]


@dataclass
class Analysis:
    """What :func:`analyze` derives from a run folder: ``requests`` and ``chunks`` (the tables
    of ``requests.parquet`` and ``chunks.parquet``), the ``summary``, and the requests'
    OpenTelemetry ``traces`` (``harness.analysis._otlp``) with the ``resource`` they come from
    (its attributes) and zerowindow's ``version``."""

    summary: RunSummary
    requests: pd.DataFrame
    chunks: pd.DataFrame
    traces: list[TraceSpan] = field(default_factory=list)
    resource: dict[str, Any] = field(default_factory=dict)
    version: str = ""


def _metrics(run_dir: Path) -> pd.DataFrame:
    metrics = read_parquet(run_dir / SERVER_METRICS)
    if "scrape_ok" not in metrics:
        metrics = pd.DataFrame({"t": pd.Series(dtype=float), "scrape_ok": pd.Series(dtype=bool)})
    return metrics


def _sockets(run_dir: Path) -> pd.DataFrame:
    sockets = read_parquet(run_dir / SOCKETS)
    return sockets if len(sockets.columns) else pd.DataFrame(columns=SOCKET_COLUMNS)


SERVER_FAILURES = ("http_error", "server_error_event", "not_sse")
"""Request outcomes that are the serving stack's failure, whatever its kind (``loadgen``'s
``OUTCOMES``): an HTTP error, an error event in the stream, a 200 that is not a stream. A
client's own leaving, a cut and a timeout are outcomes a scenario may ask for."""


def all_requests_failed(requests: pd.DataFrame) -> str | None:
    """Why the run measured nothing when every request failed on the server's side
    (:data:`SERVER_FAILURES`: a wrong model name, a wrong URL, an engine that answers every
    request with an error event or with something other than a stream), else ``None``."""
    if not len(requests) or not set(requests["outcome"]) <= set(SERVER_FAILURES):
        return None
    outcomes = ", ".join(f"{o} {n}" for o, n in requests["outcome"].value_counts().items())
    first = requests["error"].dropna() if "error" in requests else pd.Series(dtype=object)
    detail = f": {str(first.iloc[0])[:300]}" if len(first) else ""
    return f"every request ({len(requests)}) failed ({outcomes}){detail}"


def _engine_evidence(
    run_dir: Path, facts: RunFacts, metrics: pd.DataFrame, requests: pd.DataFrame,
    chunks: pd.DataFrame,
) -> tuple[
    pd.DataFrame, pd.DataFrame, dict[str, Any] | None, str | None, pd.DataFrame
]:  # fmt: skip
    """``requests`` joined with the engine's own records (its aborts from them, or estimated
    from the scrapes when there are none) and with the figures of clients that left
    (``_leaves.leave_figures``), the engine's steps, its per-request verdict (``None`` without
    records), why there are no records (``None`` when there are) and the records (empty when
    there are none to use)."""
    verdict_config = facts.scenario.verdict
    engine_requests = read_parquet(run_dir / ENGINE_REQUESTS)
    engine_steps = read_parquet(run_dir / ENGINE_STEPS)
    no_engine = probe_problem(facts.engine_probe, engine_requests)
    estimated = abort_times(metrics, requests["t_send"]) if no_engine else []
    requests = attribute_aborts(requests, estimated)
    requests, unjoined = join_engine(
        requests, chunks, engine_requests if no_engine is None else engine_requests.iloc[0:0]
    )
    if no_engine is not None:
        return leave_figures(requests, chunks), engine_steps, None, no_engine, engine_requests[0:0]
    requests = leave_figures(engine_aborts(requests), chunks, unjoined=unjoined)
    requests = prefix_reuse(requests, (facts.engine_probe or {}).get("kv_block_tokens"))
    engine_steps = engine_steps.sort_values("t") if len(engine_steps) else engine_steps
    engine_verdict = kv_held_from_requests(
        requests,
        engine_steps,
        held_min_ms=verdict_config.kv_held_min_ms,
        unjoined=unjoined,
        kv_cache_blocks=(facts.engine_probe or {}).get("kv_cache_blocks"),
        kv_block_bytes=(facts.engine_probe or {}).get("kv_block_bytes"),
        blocked_spans=send_blocked_spans(engine_requests, verdict_config.kv_held_min_ms),
    )
    return requests, engine_steps, engine_verdict, None, engine_requests


def _server(
    metrics: pd.DataFrame, facts: RunFacts, requests: pd.DataFrame, engine_steps: pd.DataFrame,
    no_engine: str | None,
) -> ServerSummary:  # fmt: skip
    """The server's figures: from the engine's own steps where it wrote them, else scrapes."""
    server = summarize_server(metrics, facts.missing_metrics, requests)
    if no_engine is None and (engine_figures := engine_server_figures(engine_steps)):
        server = server.model_copy(
            update={
                **engine_figures,
                "figures_source": "engine_probe",
                "scraped_kv_cache_usage_peak_perc": server.kv_cache_usage_peak_perc,
            }
        )
    return server


def analyze(run_dir: Path, facts: RunFacts | None = None) -> Analysis:
    """Analyse the run folder ``run_dir`` (``facts``: the life cycle's record of the run;
    default :func:`read_facts`). Reads, never writes. A ``complete`` run in which every request
    failed on the server's side (:func:`all_requests_failed`) is summarized as ``failed`` with
    the first error. Raises :class:`~zwcore.RunFolderError` for a file that cannot be read."""
    facts = facts or read_facts(run_dir)
    scenario = facts.scenario
    metrics, sockets = _metrics(run_dir), _sockets(run_dir)
    groups = [g.name for g in scenario.groups]
    records = run_records(run_dir, groups)
    # Requests meet the server on the client-facing port (the proxy's, if any).
    client_sockets = sockets[sockets["local_port"] == facts.client_port]
    chunks = chunks_frame(records)
    requests, engine_steps, engine_verdict, no_engine, engine_requests = _engine_evidence(
        run_dir, facts, metrics, requests_frame(records, client_sockets), chunks
    )
    t_first_send = float(requests["t_send"].min()) if len(requests) else None
    # Only the load's own connections: not the scraper's, nor anyone else's.
    load_sockets = client_sockets[
        client_sockets["client_port"].isin(requests["client_port"].dropna())
    ]
    verdict = kv_held_verdict(
        metrics,
        load_sockets,
        t_first_send=t_first_send,
        generation_bound_s=scenario.verdict.generation_bound_s,
        min_observe_s=scenario.verdict.min_observe_s,
    )
    server = _server(metrics, facts, requests, engine_steps, no_engine)
    status, failure = facts.status, facts.failure
    if status == "complete" and (reason := all_requests_failed(requests)):
        status, failure = "failed", reason
    proxy_rows = probe_rows(read_parquet(run_dir / PROXY))
    proxy = proxy_summary(facts.proxy_name, facts.proxy_kind, hop_rows(proxy_rows, 0))
    kv_held = combine_verdicts(engine_verdict, verdict.as_dict(), no_engine)
    clock_bound_ms = max(
        (w.clock.bound_ms for w in facts.load_workers if w.clock is not None), default=None
    )
    if clock_bound_ms is not None:  # it compares clients' moments with the engine's
        kv_held["clock_bound_ms"] = clock_bound_ms
        kv_held["line"] += f" (remote workers' clocks within {clock_bound_ms:.3f} ms)"
    verdicts = {"kv_held_by_undelivered_streams": kv_held}
    send_q = load_sockets.groupby("t")["send_q_bytes"].sum() if len(load_sockets) else None
    costs = engine_costs(server.model_dump(), 0.0 if send_q is None else float(send_q.max()))
    if costs is not None:
        verdicts["engine_costs"] = costs
    summary = RunSummary(
        scenario=scenario.name,
        status=status,
        failure=failure,
        duration_s=facts.duration_s,
        groups=[
            *(summarize_group(n, requests, chunks) for n in group_names(requests, groups)),
            *_behaviour_summaries(scenario, requests, chunks),
            *turn_summaries(
                scenario.groups, requests, lambda n, rows: summarize_requests(n, rows, chunks)
            ),
        ],
        server=server,
        verdicts=verdicts,
        client_saturation=saturation_summary(
            [p for g in groups for p in saturation_files(run_dir, g)],
            placement=facts.placement,
        ),
        proxy=proxy.model_copy(update={"hops": hop_summaries(sockets, facts.hops, proxy_rows)}),
        stalled_flows=facts.stalled_flows,
        load_workers=facts.load_workers,
        clock_bound_ms=clock_bound_ms,
        matrix=matrix_cells(scenario.matrix, requests, chunks) if scenario.matrix else [],
        accelerator=accelerator_summary(read_parquet(run_dir / ACCELERATOR), facts.accelerator),
    )
    stalls = {r.request_id: r.stalls for r in records}
    traces = run_spans(
        requests, engine_requests, stalls, wall_offset_s(requests, facts.wall_minus_monotonic_s)
    )
    resource = {"service.name": "zerowindow", "zerowindow.scenario": scenario.name,
                "zerowindow.run": run_dir.name, "zerowindow.proxy": facts.proxy_name}  # fmt: skip
    return Analysis(summary, requests, chunks, traces, resource, facts.version or "")


def _behaviour_summaries(
    scenario: Scenario, requests: pd.DataFrame, chunks: pd.DataFrame
) -> list[GroupSummary]:
    """One summary per client-mix behaviour of each group that has a mix, named
    ``<group>.<behaviour>`` (so its figures are ``<group>.<behaviour>.<figure>``)."""
    return [
        summarize_requests(
            f"{group.name}.{b.name}",
            requests[(requests["group"] == group.name) & (requests["behaviour"] == b.name)],
            chunks,
        )
        for group in scenario.groups
        for b in group.behaviours()
    ]


def write_analysis(run_dir: Path, analysis: Analysis) -> None:
    """Write ``requests.parquet``, ``chunks.parquet``, ``summary.json`` and the traces
    (``traces.otlp.json``, OTLP/JSON: ``harness.analysis._otlp``) into ``run_dir``."""
    write_parquet(analysis.requests, run_dir / REQUESTS)
    doc = otlp_json(analysis.traces, analysis.resource, analysis.version)
    (run_dir / TRACES_OTLP).write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    write_parquet(analysis.chunks, run_dir / CHUNKS)
    write_json(run_dir / SUMMARY_JSON, analysis.summary.model_dump(mode="json"))
