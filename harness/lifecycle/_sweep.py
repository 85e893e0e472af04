"""What a sweep runs: one workload at rising request rates against one target.

``zerowindow sweep SCENARIO`` makes a plan of kind ``sweep`` (``harness.scenario._plan``) whose
runs vary the scenario's open-loop groups with a rate (``constant``, ``poisson``, ``gamma``:
the swept groups; every other group runs unchanged each time):

1. ``serial``: their requests one at a time, each as soon as the one before ended (at most
   ``serial_requests`` of them): the rate one request at a time sustains;
2. ``throughput``: all their requests at once (the groups' own ``max_concurrency`` still
   applies): the rate the stack completes requests at when it has all it can take, its
   capacity;
3. ``rates_rps``, or ``steps`` rates evenly spaced strictly between the two, each run with the
   groups' own arrival kinds (a Poisson group stays Poisson) scaled to that total rate (groups
   keep their proportions).

Requests per group in the serial and throughput runs: its ``requests``, else its rate times
its ``duration_s`` (ramp included). With ``sla``, the rate is then bisected ``sla_steps``
times between the serial and throughput rates to the highest one whose run passes the
scenario's gates (gates failing at high rates do not fail the sweep); with ``sla_on =
"concurrency"``, the requests are sent all at once under a concurrency ceiling bisected
between 1 and their number instead. Each run is a complete run folder ``<run>/<label>/``; the
sweep's table is a pure function of them (``harness.analysis._sweep``).
"""

from __future__ import annotations

from typing import Any

from harness.analysis import SweepPoint, sweep_point, swept_groups
from harness.lifecycle._series import Series
from harness.scenario import RunEntry, Scenario, SweepSettings
from loadgen import ConstantArrivals, RateArrivals

ALL_AT_ONCE_RPS = 1e6  # a constant rate this high sends every request at once


def _arrivals(scenario: Scenario) -> dict[str, RateArrivals]:
    return {g.name: g.arrival for g in scenario.groups if isinstance(g.arrival, RateArrivals)}


def _with_arrivals(scenario: Scenario, arrivals: dict[str, Any]) -> Scenario:
    groups = [
        g.model_copy(update={"arrival": arrivals[g.name]}) if g.name in arrivals else g
        for g in scenario.groups
    ]
    return scenario.model_copy(update={"groups": groups})


def _count(arrival: RateArrivals) -> int:
    return int(arrival.expected_requests())


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


def between(lo: float, hi: float, steps: int) -> list[float]:
    """``steps`` rates evenly spaced strictly between ``lo`` and ``hi``."""
    return [lo + (hi - lo) * (i + 1) / (steps + 1) for i in range(steps)]


class SweepBody:
    """The body of a sweep's series (module docstring): runs each step and keeps its point."""

    def __init__(self, settings: SweepSettings) -> None:
        self.settings = settings
        self.points: list[SweepPoint] = []

    def measure(
        self, series: Series, label: str, phase: str, variant: Scenario,
        offered: float | None = None, ceiling: int | None = None,
    ) -> bool:  # fmt: skip
        """Run one step, keep its point; whether it completed and passed its gates."""
        entry = RunEntry(
            path=label, arm=label, role="step", phase=phase,
            offered_rps=offered, max_concurrency=ceiling,
        )  # fmt: skip
        run = series.run(entry, variant, None)
        groups = swept_groups(series.plan)
        self.points.append(sweep_point(run.run_dir, entry, groups, self.settings.goodput_slo_ms))
        return self.points[-1].passed

    def __call__(self, series: Series) -> None:
        scenario, s = series.scenario, self.settings
        self.measure(series, "serial", "serial", serial_variant(scenario, s.serial_requests))
        self.measure(series, "throughput", "throughput", throughput_variant(scenario))
        lo, hi = self.points[0].completed_rps, self.points[1].completed_rps
        todo = s.rates_rps if s.rates_rps is not None else (
            between(lo, hi, s.steps) if lo and hi else []
        )  # fmt: skip
        for i, rate in enumerate(todo, 1):
            variant = rate_variant(scenario, rate)
            self.measure(series, f"rate{i:02d}-{rate:.3g}rps", "rate", variant, offered=rate)
        if s.sla and s.sla_on == "rate" and lo and hi:
            self._search_rate(series, lo, hi)
        elif s.sla and s.sla_on == "concurrency":
            self._search_concurrency(series)

    def _search_rate(self, series: Series, lo: float, hi: float) -> None:
        for i in range(1, self.settings.sla_steps + 1):
            mid = (lo + hi) / 2
            variant = rate_variant(series.scenario, mid)
            if self.measure(series, f"sla{i:02d}-{mid:.3g}rps", "sla", variant, mid):
                lo = mid
            else:
                hi = mid

    def _search_concurrency(self, series: Series) -> None:
        low, high = 1, max(_count(a) for a in _arrivals(series.scenario).values())
        for i in range(1, self.settings.sla_steps + 1):
            mid = (low + high + 1) // 2
            if mid <= low:
                break
            variant = throughput_variant(series.scenario, mid)
            if self.measure(series, f"sla{i:02d}-c{mid}", "sla", variant, ceiling=mid):
                low = mid
            else:
                high = mid - 1
