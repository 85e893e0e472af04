"""A series of runs against one target: what a proxy comparison and a sweep share.

:func:`run_series` plans the scenario's network (if it needs one), starts the target once
(inside the server's namespace when there is a network), sends :data:`WARMUP_REQUESTS` short
requests straight to it (vLLM's first requests after start are several times slower, and the
first run must not alone pay for them), then hands a :class:`Series` to the caller's body,
which runs variants of the scenario one after another (:meth:`Series.run`: each waits until
the engine is idle, runs into ``<run>/<name>/`` as a complete run folder, and leaves the
target running). Whatever happens, the target is stopped, the network released, the engine's
tables brought into ``<run>/`` and ``<run>/<record>`` written (``comparison-run.json``,
``sweep-run.json``): scenario, versions, host, placement, warm-up, idle waits, network,
target, exit code and failure.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from harness.collectors import collect_engine_tables, parse_vllm_metrics
from harness.lifecycle._conclude import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SETUP,
    RunResult,
    conclude,
)
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._netrun import start_target
from harness.lifecycle._placement import pinned_to_load, place_target
from harness.lifecycle._run import RunLifecycle, RunPlan, open_run_dir, plan_run
from harness.lifecycle._runinfo import host_facts, versions
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.runfolder import write_json
from harness.scenario import NamedProxyConfig, Scenario
from loadgen import RequestSpec, build_prompt, prompt_seed, stream_request
from zwcore import NetworkError, TargetError

IDLE_TIMEOUT_S = 120.0
WARMUP_REQUESTS = 3


@dataclass
class SeriesResult:
    """What a series produced: the parent folder, each run (by name, in run order), the exit
    code (0 all complete, 1 one failed, 2 the target could not start, 130 interrupted) and
    why it is not 0."""

    run_dir: Path
    runs: dict[str, RunResult] = field(default_factory=dict)
    exit_code: int = EXIT_OK
    failure: str | None = None


@dataclass
class Series:
    """The running target of a series (as :func:`plan_run` planned it, started in
    ``run_dir``); :meth:`run` runs one variant of the scenario. ``info`` is the series's
    record, ``result`` what it produced so far."""

    plan: RunPlan
    scenario_path: Path | None
    run_dir: Path
    distribution: Distribution | None
    result: SeriesResult
    info: dict[str, Any]

    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    def run(
        self,
        name: str,
        scenario: Scenario | None = None,
        proxy: NamedProxyConfig | None = None,
        *,
        fail_on_gates: bool = True,
    ) -> RunResult:
        """Run ``scenario`` (default: the series's own) through ``proxy`` (default: the
        scenario's ``proxy``) into ``<run>/<name>/``, once the engine is idle. A run that
        failed, or failed a gate when ``fail_on_gates``, makes the series's exit code 1; raises
        :class:`~harness.lifecycle._signals.RunInterrupted` when the run was interrupted and
        :class:`~zwcore.TargetError` when the target died before it."""
        target = self.plan.target
        if reason := target.failure():
            raise TargetError(reason)
        self.info["idle_wait_s"][name] = wait_idle(target.base_url)
        sub_dir = self.run_dir / name
        sub_dir.mkdir()
        run = RunLifecycle(
            scenario or self.scenario,
            self.scenario_path,
            sub_dir,
            target,
            proxy=proxy,
            manage_target=False,
            network=self.plan.network,
            distribution=self.distribution,
            placement=self.plan.placement,
        )
        facts = run.execute()
        outcome = conclude(sub_dir, facts, run.info, setup_failed=run.setup_failed)
        self.result.runs[name] = outcome
        if outcome.exit_code == EXIT_INTERRUPTED:
            raise RunInterrupted("signal")
        failed = outcome.summary.status != "complete"
        if outcome.exit_code != EXIT_OK and (fail_on_gates or failed):
            self.result.exit_code = EXIT_FAILED
            failed_gates = [g.gate for g in outcome.gates if not g.passed]
            reason = outcome.summary.failure or f"gates failed: {', '.join(failed_gates)}"
            self.result.failure = f"{name}: {reason}"
        return outcome


def wait_idle(base_url: str, *, timeout_s: float = IDLE_TIMEOUT_S) -> float | None:
    """Wait until ``{base_url}/metrics`` reports no running and no waiting request; return how
    long that took (s), or ``None`` if it did not happen within ``timeout_s`` or the server
    does not report those gauges (then it returns at once: there is nothing to wait for)."""
    t0 = time.monotonic()
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() - t0 < timeout_s:
            try:
                response = client.get(f"{base_url}/metrics")
                response.raise_for_status()
                figures = parse_vllm_metrics(response.text)
            except (httpx.HTTPError, ValueError):
                time.sleep(0.25)
                continue
            if "num_requests_running" not in figures:
                return None
            busy = figures["num_requests_running"] + figures.get("num_requests_waiting", 0)
            if busy == 0:
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
    scenario: Scenario,
    body: Callable[[Series], None],
    *,
    record: str,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    target_url: str | None = None,
    distribution: Distribution | None = None,
    info: dict[str, Any] | None = None,
) -> SeriesResult:
    """Start ``scenario``'s target once and call ``body`` with the :class:`Series` (module
    docstring), under ``out_root/<name>/<UTC timestamp>/``; ``record`` names the series's own
    JSON file there, ``info`` adds to it. Never raises for failures of the target, the
    network or the runs (they end up in the record and the exit code). Raises, before anything
    starts, :class:`~harness.scenario._models.ScenarioError` for an invalid ``target_url`` or
    a network the target cannot join, and
    :class:`~harness.lifecycle.DistributedError` for ``distribution`` with remote workers (they
    quit with their master after the first run) or, with a network, a master address other
    than loopback."""
    if distribution is not None:
        distribution.check_for_series()
    plan = plan_run(scenario, target_url=target_url, distribution=distribution)
    scenario, target, network, placement = plan.scenario, plan.target, plan.network, plan.placement
    run_dir = open_run_dir(out_root, scenario, scenario_path)
    place_target(placement, target.processes())
    result = SeriesResult(run_dir)
    facts: dict[str, Any] = {
        "scenario": scenario.model_dump(mode="json"),
        **(info or {}),
        "versions": versions(),
        "host": host_facts(),
        "started_utc": datetime.now(UTC).isoformat(),
        "idle_wait_s": {},
        "placement": placement.describe(),
    }
    series = Series(plan, scenario_path, run_dir, distribution, result, facts)
    with signals_raise(), pinned_to_load(placement):
        try:
            start_target(target, network, run_dir)
            facts["warmup"] = warm_up(target.base_url, target.served_model_name)
            body(series)
        except RunInterrupted as exc:
            result.exit_code, result.failure = EXIT_INTERRUPTED, f"stopped by {exc}"
        except (TargetError, NetworkError) as exc:
            result.exit_code = EXIT_FAILED if result.runs else EXIT_SETUP
            prefix = "network: " if isinstance(exc, NetworkError) else ""
            result.failure = f"{prefix}{exc}"
        except OSError as exc:
            result.exit_code, result.failure = EXIT_SETUP, f"cannot start the run: {exc}"
        finally:
            target.stop()
            if network is not None:
                network.teardown(run_dir)
                facts["network"] = network.describe()
    facts["target"] = target.describe()
    facts["engine_probe"] = target.engine_probe()
    if why := collect_engine_tables(run_dir, target.engine_dir, t_start=0.0):
        facts["engine_probe"] = {**facts["engine_probe"], "status": "failed", "reason": why}
    facts.update(
        exit_code=result.exit_code,
        failure=result.failure,
        ended_utc=datetime.now(UTC).isoformat(),
    )
    write_json(run_dir / record, facts)
    return result
