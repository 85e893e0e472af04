"""Saturation sweeps: one workload at rising request rates against one target.

``zerowindow sweep SCENARIO`` starts the target once (a series, ``harness.lifecycle._series``)
and runs the scenario's open-loop groups with a rate (``constant``, ``poisson``, ``gamma``:
the swept groups; every other group runs unchanged each time):

1. ``serial``: their requests one at a time, each as soon as the one before ended (at most
   ``serial_requests`` of them): the rate one request at a time sustains;
2. ``throughput``: all their requests at once (the groups' own ``max_concurrency`` still
   applies): the rate the stack completes requests at when it has all it can take, its
   capacity;
3. ``rates``, or ``steps`` rates evenly spaced strictly between the two, each run with the
   groups' own arrival kinds (a Poisson group stays Poisson) scaled to that total rate (groups
   keep their proportions).

Requests per group in the serial and throughput runs: its ``requests``, else its rate times
its ``duration_s`` (ramp included). With ``sla``, the rate is then bisected ``sla_steps``
times between the serial and throughput rates to the highest one whose run passes the
scenario's gates (``sla_rps``; gates failing at high rates do not fail the sweep); with
``sla_on = "concurrency"``, the requests are sent all at once under a concurrency ceiling
bisected between 1 and their number instead (``sla_concurrency``). Each run
is a complete run folder ``<run>/<label>/``; the sweep's table (:class:`SweepPoint` rows) goes
to ``sweep.json``, ``sweep.md`` and ``sweep.html`` (``harness.outputs``).

Figures per run, pooled over the swept groups' requests: ``offered_rps`` (the rate asked
for; ``None`` for serial and throughput), ``sent_rps``, ``completed_rps`` (completed requests
over the span from the first send to the last end), TTFT and end-to-end latency from the
scheduled send, per-token ITL, output tokens/s, KV peak and preemptions (the server's).
``goodput_rps`` counts only the completed requests that met every service-level objective
of ``goodput`` (``{"ttft": ms, "tpot": ms, "e2el": ms}``, as ``vllm bench serve --goodput``:
TTFT and end-to-end latency from the scheduled send, TPOT per output token after the first).
The serial, throughput and concurrency-ceiling runs send everything at once, so their
latencies are counted from each request's actual send instead.
``capacity_rps`` is the throughput run's ``completed_rps``; ``kept_up_rps`` the highest
offered rate whose ``completed_rps`` came within 10 % of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pandas as pd

from harness.analysis._summary import summarize_requests
from harness.lifecycle._conclude import RunResult
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._series import Series, SeriesResult, run_series
from harness.outputs import write_sweep
from harness.runfolder import CHUNKS, REQUESTS, read_parquet
from harness.scenario import Scenario, ScenarioError, needs_baseline
from loadgen import ConstantArrivals
from loadgen._arrivals import RateArrivals

SWEEP_RUN_JSON = "sweep-run.json"
ALL_AT_ONCE_RPS = 1e6  # a constant rate this high sends every request at once
KEPT_UP = 0.9


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


@dataclass
class SweepResult:
    """A sweep: its folder, runs, points (in run order), capacity, the highest offered rate
    it kept up with, the SLA rate (``sla`` only), exit code and failure."""

    run_dir: Path
    runs: dict[str, RunResult] = field(default_factory=dict)
    points: list[SweepPoint] = field(default_factory=list)
    capacity_rps: float | None = None
    kept_up_rps: float | None = None
    sla_rps: float | None = None
    sla_concurrency: int | None = None
    goodput: dict[str, float] = field(default_factory=dict)
    exit_code: int = 0
    failure: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """``sweep.json``: the points and the sweep's figures."""
        return {
            "capacity_rps": self.capacity_rps,
            "kept_up_rps": self.kept_up_rps,
            "sla_rps": self.sla_rps,
            "sla_concurrency": self.sla_concurrency,
            "goodput_slo_ms": self.goodput,
            "exit_code": self.exit_code,
            "failure": self.failure,
            "points": [asdict(p) for p in self.points],
        }


def swept_groups(scenario: Scenario) -> list[str]:
    """The groups a sweep varies: open-loop with a rate. Raises :class:`ScenarioError` when
    there is none."""
    names = [g.name for g in scenario.groups if isinstance(g.arrival, RateArrivals)]
    if not names:
        raise ScenarioError(
            'a sweep needs a group with arrival = { kind = "constant" | "poisson" | '
            '"gamma", rate_rps = ... } (an open-loop group with a rate) to vary'
        )
    return names


def _arrivals(scenario: Scenario) -> dict[str, RateArrivals]:
    return {g.name: g.arrival for g in scenario.groups if isinstance(g.arrival, RateArrivals)}


def _with_arrivals(scenario: Scenario, arrivals: dict[str, Any]) -> Scenario:
    groups = [
        g.model_copy(update={"arrival": arrivals[g.name]}) if g.name in arrivals else g
        for g in scenario.groups
    ]
    return scenario.model_copy(update={"groups": groups})


def serial_variant(scenario: Scenario, serial_requests: int) -> Scenario:
    """The swept groups' requests one at a time (at most ``serial_requests`` each)."""
    return _with_arrivals(scenario, {
        n: ConstantArrivals(
            rate_rps=ALL_AT_ONCE_RPS, max_concurrency=1,
            requests=min(serial_requests, _count(a)),
        )
        for n, a in _arrivals(scenario).items()
    })  # fmt: skip


def throughput_variant(scenario: Scenario, max_concurrency: int | None = None) -> Scenario:
    """The swept groups' requests all at once, at most ``max_concurrency`` in flight per group
    (default: each group's own ceiling)."""
    return _with_arrivals(scenario, {
        n: ConstantArrivals(
            rate_rps=ALL_AT_ONCE_RPS, max_concurrency=max_concurrency or a.max_concurrency,
            requests=_count(a),
        )
        for n, a in _arrivals(scenario).items()
    })  # fmt: skip


def rate_variant(scenario: Scenario, total_rps: float) -> Scenario:
    """The swept groups at ``total_rps`` requests/s in all, in their own proportions."""
    arrivals = _arrivals(scenario)
    base = sum(a.rate_rps for a in arrivals.values())
    return _with_arrivals(scenario, {
        n: a.model_copy(update={"rate_rps": a.rate_rps * total_rps / base})
        for n, a in arrivals.items()
    })  # fmt: skip


def _count(arrival: RateArrivals) -> int:
    return int(arrival.expected_requests())


GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}
_FROM_SCHEDULED = {"ttft_ms": "ttft_from_scheduled_ms", "e2e_ms": "e2e_from_scheduled_ms"}


def parse_goodput(items: list[str]) -> dict[str, float]:
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


def _good(done: pd.DataFrame, slo: dict[str, float], *, from_send: bool) -> pd.Series:
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


def point(
    label: str,
    phase: str,
    offered: float | None,
    run: RunResult,
    groups: list[str],
    *,
    goodput: dict[str, float] | None = None,
    max_concurrency: int | None = None,
) -> SweepPoint:
    """The figures of one run (module docstring), pooled over ``groups``. The serial and
    throughput runs count latencies from the send: their schedule is all at once, so a wait
    for the ceiling's slot is the sweep's doing, not the server's."""
    from_send = phase in ("serial", "throughput") or max_concurrency is not None
    requests = read_parquet(run.run_dir / REQUESTS)
    chunks = read_parquet(run.run_dir / CHUNKS)
    mine = requests[requests["group"].isin(groups)] if len(requests) else requests
    pooled = summarize_requests("swept", mine, chunks)
    done = mine[mine["outcome"] == "complete"] if len(mine) else mine
    completed = good = None
    if len(done) > 1:
        span = float(done["t_end"].max() - mine["t_send"].min())
        completed = len(done) / span if span > 0 else None
        if goodput and span > 0:
            good = int(_good(done, goodput, from_send=from_send).sum()) / span
    server = run.summary.server
    return SweepPoint(
        label=label,
        phase=phase,
        offered_rps=offered,
        max_concurrency=max_concurrency,
        status=run.summary.status,
        gates_passed=all(g.passed for g in run.gates) if run.gates else None,
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
        kv_cache_usage_peak_perc=server.kv_cache_usage_peak_perc,
        preemptions=server.preemptions,
    )


def between(lo: float, hi: float, steps: int) -> list[float]:
    """``steps`` rates evenly spaced strictly between ``lo`` and ``hi``."""
    return [lo + (hi - lo) * (i + 1) / (steps + 1) for i in range(steps)]


def run_sweep(
    scenario: Scenario,
    *,
    steps: int = 4,
    rates: list[float] | None = None,
    sla: bool = False,
    sla_on: Literal["rate", "concurrency"] = "rate",
    sla_steps: int = 5,
    serial_requests: int = 32,
    goodput: dict[str, float] | None = None,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    target_url: str | None = None,
    distribution: Distribution | None = None,
) -> SweepResult:
    """Sweep ``scenario`` (module docstring) under ``out_root/<name>/<UTC timestamp>/``.
    Never raises for failures of the target or a run (they end up in ``sweep-run.json``, the
    runs' folders and the exit code). Raises :class:`ScenarioError`, before anything starts,
    for a scenario with no group to sweep, ``proxies = [...]`` or gates relative to a
    baseline, and what :func:`~harness.lifecycle._series.run_series` raises."""
    groups = swept_groups(scenario)
    if scenario.proxies:
        raise ScenarioError("a sweep runs one proxy configuration: use [proxy], not proxies")
    if needs_baseline(scenario.gates):
        raise ScenarioError("a sweep gates each run on its own figures: no 'baseline' gates")
    sweep = SweepResult(Path(), goodput=dict(goodput or {}))

    def measure(
        series: Series, label: str, phase: str, variant: Scenario,
        offered: float | None = None, ceiling: int | None = None,
    ) -> bool:  # fmt: skip
        """Run one variant, keep its point; whether it passed its gates."""
        run = series.run(label, variant, fail_on_gates=False)
        p = point(label, phase, offered, run, groups, goodput=goodput, max_concurrency=ceiling)
        sweep.points.append(p)
        return p.status == "complete" and p.gates_passed is not False

    def search_rate(series: Series, lo: float, hi: float) -> None:
        for i in range(1, sla_steps + 1):
            mid = (lo + hi) / 2
            if measure(series, f"sla{i:02d}-{mid:.3g}rps", "sla", rate_variant(scenario, mid), mid):
                sweep.sla_rps, lo = mid, mid
            else:
                hi = mid

    def search_concurrency(series: Series) -> None:
        low, high = 1, max(_count(a) for a in _arrivals(scenario).values())
        for i in range(1, sla_steps + 1):
            mid = (low + high + 1) // 2
            if mid <= low:
                break
            variant = throughput_variant(scenario, mid)
            if measure(series, f"sla{i:02d}-c{mid}", "sla", variant, ceiling=mid):
                sweep.sla_concurrency, low = mid, mid
            else:
                high = mid - 1

    def body(series: Series) -> None:
        measure(series, "serial", "serial", serial_variant(scenario, serial_requests))
        measure(series, "throughput", "throughput", throughput_variant(scenario))
        lo, hi = sweep.points[0].completed_rps, sweep.points[1].completed_rps
        sweep.capacity_rps = hi
        todo = rates if rates is not None else (between(lo, hi, steps) if lo and hi else [])
        for i, rate in enumerate(todo, 1):
            variant = rate_variant(scenario, rate)
            measure(series, f"rate{i:02d}-{rate:.3g}rps", "rate", variant, offered=rate)
        if sla and sla_on == "rate" and lo and hi:
            search_rate(series, lo, hi)
        elif sla and sla_on == "concurrency":
            search_concurrency(series)

    done: SeriesResult = run_series(
        scenario, body,
        record=SWEEP_RUN_JSON, scenario_path=scenario_path, out_root=out_root,
        target_url=target_url, distribution=distribution, info={"swept_groups": groups},
    )  # fmt: skip
    sweep.run_dir, sweep.runs = done.run_dir, done.runs
    sweep.exit_code, sweep.failure = done.exit_code, done.failure
    kept = [
        p.offered_rps for p in sweep.points
        if p.offered_rps and p.completed_rps and p.completed_rps >= KEPT_UP * p.offered_rps
    ]  # fmt: skip
    sweep.kept_up_rps = max(kept) if kept else None
    write_sweep(sweep.as_dict(), sweep.run_dir, title=scenario.name)
    return sweep


def points_frame(points: list[SweepPoint]) -> pd.DataFrame:
    """The points as a table (one row per run)."""
    return pd.DataFrame([asdict(p) for p in points])
