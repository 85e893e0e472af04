"""A sweep's table: the figures of each of its runs against the rate, and the sweep's own
figures, a pure function of the runs' folders (``zerowindow sweep``; what it runs is
``harness.lifecycle._sweep``).

Figures per run, pooled over the swept groups' requests: ``offered_rps`` (the rate asked
for; ``None`` for serial and throughput), ``sent_rps``, ``completed_rps`` (completed requests
over the span from the first send to the last end), TTFT and end-to-end latency from the
scheduled send, per-token ITL, output tokens/s, KV peak and preemptions (the server's).
``goodput_rps`` counts only the completed requests that met every service-level objective
of ``goodput`` (``{"ttft": ms, "tpot": ms, "e2el": ms}``, as ``vllm bench serve --goodput``:
TTFT and end-to-end latency from the scheduled send, TPOT per output token after the first).
The serial, throughput and concurrency-ceiling runs send everything at once, so their
latencies are counted from each request's actual send instead.

The sweep's figures: ``capacity_rps`` is the throughput run's ``completed_rps``;
``kept_up_rps`` the highest offered rate whose ``completed_rps`` came within 10 % of it;
``sla_rps`` (``sla_concurrency``) the highest rate (ceiling) of the bisection whose run passed
its gates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis._summary import summarize_requests
from harness.runfolder import CHUNKS, GATES_JSON, REQUESTS, SUMMARY_JSON, read_json, read_parquet
from harness.scenario import GOODPUT_KEYS, RunEntry

KEPT_UP = 0.9
_FROM_SCHEDULED = {"ttft_ms": "ttft_from_scheduled_ms", "e2e_ms": "e2e_from_scheduled_ms"}


@dataclass
class SweepPoint:
    """One run of a sweep (see the module docstring for the figures)."""

    label: str
    phase: str  # serial | throughput | rate | sla
    offered_rps: float | None
    max_concurrency: int | None
    status: str
    gates_passed: bool | None
    requests: int
    sent_rps: float | None
    completed_rps: float | None
    goodput_rps: float | None
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    itl_p50_ms: float | None
    itl_p99_ms: float | None
    e2e_p50_ms: float | None
    output_tokens_per_s: float | None
    kv_cache_usage_peak_perc: float | None
    preemptions: float | None

    @property
    def passed(self) -> bool:
        """Whether the run completed and passed its gates (none counts as passed)."""
        return self.status == "complete" and self.gates_passed is not False


@dataclass
class SweepTable:
    """A sweep's points (in run order) and its figures (module docstring)."""

    points: list[SweepPoint] = field(default_factory=list)
    capacity_rps: float | None = None
    kept_up_rps: float | None = None
    sla_rps: float | None = None
    sla_concurrency: int | None = None
    goodput: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """``sweep.json``: the points and the sweep's figures."""
        return {
            "capacity_rps": self.capacity_rps,
            "kept_up_rps": self.kept_up_rps,
            "sla_rps": self.sla_rps,
            "sla_concurrency": self.sla_concurrency,
            "goodput_slo_ms": self.goodput,
            "points": [asdict(p) for p in self.points],
        }


def parse_goodput(items: Sequence[str]) -> dict[str, float]:
    """``["ttft:500", "tpot:50"]`` (vLLM's ``--goodput`` form, ms) as ``{"ttft": 500.0, ...}``.
    Raises ``ValueError`` naming the bad item and the valid keys."""
    out = {}
    for item in items:
        key, sep, value = item.partition(":")
        try:
            bound = float(value)
        except ValueError:
            bound = -1.0
        if not sep or key not in GOODPUT_KEYS or not bound > 0:
            raise ValueError(
                f"--goodput {item!r}: expected KEY:MS with KEY one of "
                f"{', '.join(GOODPUT_KEYS)} and MS above 0, e.g. ttft:500"
            )
        out[key] = bound
    return out


def _good(done: pd.DataFrame, slo: Mapping[str, float], *, from_send: bool) -> pd.Series:
    """Which completed requests met every objective of ``slo`` (latencies from the scheduled
    send where there is one, unless ``from_send``)."""
    ok = pd.Series(True, index=done.index)
    for key, bound in slo.items():
        column = GOODPUT_KEYS[key]
        value = done[column]
        if not from_send and (scheduled := _FROM_SCHEDULED.get(column)) in done:
            value = done[scheduled].fillna(value)
        ok &= value.le(bound).fillna(False)
    return ok


def sweep_point(
    run_dir: Path, entry: RunEntry, groups: Sequence[str], goodput: Mapping[str, float]
) -> SweepPoint:
    """The figures of one run of a sweep (module docstring), pooled over ``groups``, from its
    folder (``requests.parquet``, ``chunks.parquet``, ``summary.json``, ``gates.json``). The
    serial and throughput runs count latencies from the send: their schedule is all at once,
    so a wait for the ceiling's slot is the sweep's doing, not the server's."""
    from_send = entry.phase in ("serial", "throughput") or entry.max_concurrency is not None
    requests = read_parquet(run_dir / REQUESTS)
    chunks = read_parquet(run_dir / CHUNKS)
    mine = requests[requests["group"].isin(groups)] if len(requests) else requests
    pooled = summarize_requests("swept", mine, chunks)
    done = mine[mine["outcome"] == "complete"] if len(mine) else mine
    completed = good = None
    if len(done) > 1:
        span = float(done["t_end"].max() - mine["t_send"].min())
        completed = len(done) / span if span > 0 else None
        if goodput and span > 0:
            good = int(_good(done, goodput, from_send=from_send).sum()) / span
    summary = read_json(run_dir / SUMMARY_JSON)
    server = summary.get("server") or {}
    gated = run_dir / GATES_JSON
    gates = read_json(gated).get("gates", []) if gated.exists() else []
    return SweepPoint(
        label=entry.path,
        phase=entry.phase or "rate",
        offered_rps=entry.offered_rps,
        max_concurrency=entry.max_concurrency,
        status=str(summary.get("status", "failed")),
        gates_passed=all(g["passed"] for g in gates) if gates else None,
        requests=len(mine),
        sent_rps=pooled.sent_rps,
        completed_rps=completed,
        goodput_rps=good,
        ttft_p50_ms=pooled.ttft_p50_ms if from_send else pooled.ttft_from_scheduled_p50_ms,
        ttft_p99_ms=pooled.ttft_p99_ms if from_send else pooled.ttft_from_scheduled_p99_ms,
        itl_p50_ms=pooled.itl_p50_ms,
        itl_p99_ms=pooled.itl_p99_ms,
        e2e_p50_ms=pooled.e2e_p50_ms if from_send else pooled.e2e_from_scheduled_p50_ms,
        output_tokens_per_s=pooled.output_tokens_per_s,
        kv_cache_usage_peak_perc=server.get("kv_cache_usage_peak_perc"),
        preemptions=server.get("preemptions"),
    )


def sweep_table(points: Sequence[SweepPoint], goodput: Mapping[str, float]) -> SweepTable:
    """The sweep's figures over its ``points`` (module docstring)."""
    table = SweepTable(list(points), goodput=dict(goodput))
    throughput = [p for p in points if p.phase == "throughput"]
    table.capacity_rps = throughput[0].completed_rps if throughput else None
    kept = [
        p.offered_rps for p in points
        if p.offered_rps and p.completed_rps and p.completed_rps >= KEPT_UP * p.offered_rps
    ]  # fmt: skip
    table.kept_up_rps = max(kept) if kept else None
    passed = [p for p in points if p.phase == "sla" and p.passed]
    rates = [p.offered_rps for p in passed if p.offered_rps is not None]
    ceilings = [p.max_concurrency for p in passed if p.max_concurrency is not None]
    table.sla_rps = max(rates) if rates else None
    table.sla_concurrency = max(ceilings) if ceilings else None
    return table


def points_frame(points: Sequence[SweepPoint]) -> pd.DataFrame:
    """The points as a table (one row per run)."""
    return pd.DataFrame([asdict(p) for p in points])
