"""The runs of a plan of several against one target (repeats, control runs, a comparison, a
sweep): one set-up, one warm-up, then one run after another.

:func:`run_series` plans the scenario's network (if it needs one), starts the target once
(inside the server's namespace when there is a network), sends :data:`WARMUP_REQUESTS` short
requests straight to it (vLLM's first requests after start are several times slower, and the
first run must not alone pay for them), then hands a :class:`Series` to the caller's body,
which runs the plan's runs one after another (:meth:`Series.run`: each waits until the engine
is idle, runs into its folder as a complete run folder, and leaves the target running).
Whatever happens, the target is stopped, the network released, the engine's tables brought
into the plan's folder, and ``plan.json`` written: the plan, the runs it made, versions,
host, placement, warm-up, idle waits, network, target, and why it stopped early, if it did.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from harness.analysis import PlanRecord
from harness.collectors import collect_engine_tables
from harness.lifecycle._conclude import conclude
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._netrun import start_target
from harness.lifecycle._placement import pinned_to_load, place_target
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._results import RunResult
from harness.lifecycle._run import RunLifecycle, RunPlan
from harness.lifecycle._runinfo import ci_facts, harness_process, host_facts, versions
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.runfolder import PLAN_JSON, keep_plugins, write_json
from harness.scenario import NamedProxyConfig, Plan, RunEntry, Scenario
from harness.servers import Target
from loadgen import RequestSpec, build_prompt, prompt_seed, stream_request
from zwcore import NetworkError, TargetError, http_client

IDLE_TIMEOUT_S = 120.0
WARMUP_REQUESTS = 3


@dataclass
class Series:
    """The running target of a plan's series (as :func:`~harness.lifecycle._run.plan_run`
    planned it, started in ``run_dir``); :meth:`run` runs one run of the plan. ``record`` is
    what ``plan.json`` will say, ``results`` each run's result by its path."""

    plan: Plan
    setup: RunPlan
    run_dir: Path
    distribution: Distribution | None
    record: PlanRecord
    results: dict[str, RunResult] = field(default_factory=dict)
    history: Path | None = None

    @property
    def scenario(self) -> Scenario:
        """The scenario as it runs (``--target-url`` and the network applied)."""
        return self.setup.scenario

    def run(
        self,
        entry: RunEntry,
        scenario: Scenario | None = None,
        proxy: NamedProxyConfig | None = None,
    ) -> RunResult:
        """Run ``scenario`` (default: the series's own) through ``proxy`` (default: the
        scenario's ``proxy``) into ``<run>/<entry.path>/``, once the engine is idle. Raises
        :class:`~harness.lifecycle._signals.RunInterrupted` when the run was interrupted and
        :class:`~zwcore.TargetError` when the target died before it."""
        target = self.setup.target
        if reason := target.failure():
            raise TargetError(reason)
        self.record.info["idle_wait_s"][entry.path] = wait_idle(target)
        sub_dir = self.run_dir / entry.path
        sub_dir.mkdir(parents=True)
        variant = scenario or self.scenario
        keep_plugins(sub_dir, variant.plugins)
        path = self.plan.scenario_path
        run = RunLifecycle(
            variant,
            None if path is None else Path(path),
            sub_dir,
            target,
            proxy=proxy,
            manage_target=False,
            network=self.setup.network,
            distribution=self.distribution,
            placement=self.setup.placement,
        )
        if self.plan.options.progress:
            run.progress = RunProgress()
            run.progress.start(
                scenario=f"{variant.name} {entry.path}", run_dir=sub_dir,
                groups=[g.name for g in variant.groups], max_duration_s=variant.max_duration_s,
            )  # fmt: skip
        try:
            facts = run.execute()
        finally:
            if run.progress is not None:
                run.progress.stop()
        outcome = conclude(
            sub_dir, facts, run.info, setup_failed=run.setup_failed, history=self.history
        )
        self.record.runs.append(entry)
        self.results[entry.path] = outcome
        if facts.status == "interrupted":
            raise RunInterrupted("signal")
        return outcome


def wait_idle(target: Target, *, timeout_s: float = IDLE_TIMEOUT_S) -> float | None:
    """Wait until the engine of ``target`` is idle by its kind's test (:meth:`Target.idle`: no
    request running and none waiting, read from its ``/metrics`` by its own metric names; a
    ``url`` target's by every registered kind's). Return how long that took (s), or ``None``
    if it did not happen within ``timeout_s`` or the server does not report a running gauge
    (then it returns at once: there is nothing to wait for). A ``/metrics`` that does not
    answer is asked again every 0.25 s."""
    t0 = time.monotonic()
    with http_client(timeout=5.0) as client:
        while time.monotonic() - t0 < timeout_s:
            try:
                idle = target.idle(client)
            except (httpx.HTTPError, ValueError):
                time.sleep(0.25)
                continue
            if idle is None:
                return None
            if idle:
                return time.monotonic() - t0
            time.sleep(0.25)
    return None


def warm_up(base_url: str, model: str, *, requests: int = WARMUP_REQUESTS) -> list[dict[str, Any]]:
    """Send ``requests`` short streaming completions (32 prompt words, 16 tokens) to
    ``base_url`` one after another with the load generator's client; return each one's
    ``outcome`` and duration ``e2e_s``. Never raises for a failed request (its outcome says)."""
    out = []
    for i in range(requests):
        spec = RequestSpec(
            host=base_url,
            model=model,
            prompt=build_prompt(32, prompt_seed("warm-up", i)),
            prompt_tokens=32,
            max_tokens=16,
            timeout_s=120.0,
            group="warm-up",
        )
        record = stream_request(spec)
        end = record.t_end if record.t_end is not None else record.t_send
        out.append({"outcome": record.outcome, "e2e_s": end - record.t_send})
    return out


def run_series(
    plan: Plan,
    setup: RunPlan,
    run_dir: Path,
    body: Callable[[Series], None],
    *,
    distribution: Distribution | None = None,
    history: Path | None = None,
) -> Series:
    """Start ``setup``'s target once and call ``body`` with the :class:`Series` (module
    docstring), in ``run_dir``. Never raises for failures of the target, the network or the
    runs: ``plan.json``'s ``status`` (``complete``, ``failed``, ``interrupted``),
    ``setup_failed`` (nothing ran: the stack did not start) and ``failure`` say what
    happened."""
    target, network, placement = setup.target, setup.network, setup.placement
    place_target(placement, target.processes())
    info: dict[str, Any] = {
        "versions": versions(target),
        "host": host_facts(),
        "ci": ci_facts(),
        "started_utc": datetime.now(UTC).isoformat(),
        "idle_wait_s": {},
        "placement": placement.describe(),
        "status": "running",
        "harness": harness_process(),
    }
    series = Series(plan, setup, run_dir, distribution, PlanRecord(plan, [], info), history=history)
    write_json(run_dir / PLAN_JSON, series.record.as_dict())
    status, failure, setup_failed = "complete", None, False
    with signals_raise(), pinned_to_load(placement):
        try:
            start_target(target, network, run_dir)
            info["warmup"] = warm_up(target.base_url, target.served_model_name)
            body(series)
        except RunInterrupted as exc:
            status, failure = "interrupted", f"stopped by {exc}"
        except (TargetError, NetworkError) as exc:
            status, setup_failed = "failed", not series.results
            failure = f"{'network: ' if isinstance(exc, NetworkError) else ''}{exc}"
        except OSError as exc:
            status, setup_failed = "failed", True
            failure = f"cannot start the run: {exc}"
        finally:
            target.stop()
            if network is not None:
                network.teardown(run_dir)
                info["network"] = network.describe()
    info["target"] = target.describe()
    info["engine_probe"] = target.engine_probe()
    if why := collect_engine_tables(run_dir, target.engine_dir, t_start=0.0):
        info["engine_probe"] = {**info["engine_probe"], "status": "failed", "reason": why}
    info.update(
        status=status, setup_failed=setup_failed, failure=failure,
        ended_utc=datetime.now(UTC).isoformat(),
    )  # fmt: skip
    write_json(run_dir / PLAN_JSON, series.record.as_dict())
    return series
