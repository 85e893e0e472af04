"""One workload through several proxy configurations against one target: ``proxies = [...]``.

:func:`run_comparison` starts the scenario's target once, then for each entry of the
scenario's ``proxies`` in turn waits until the engine is idle (no running or waiting request),
starts that proxy and runs the scenario's groups through it into ``<run>/<name>/`` (a complete
run folder each: tables, ``summary.json``, ``run.json``, the scenario's gates evaluated on
that configuration's figures in ``gates.json``/``junit.xml``, ``report.html``), and stops the
proxy. The workload is identical in each: the load processes are started afresh with the same
seed, so the same users send the same prompts (``loadgen._prompt``: seeded by run seed, group,
user and request index) on the same schedule (spawn rate, ``start_after_s``, ``wait_s``).
Before the first configuration, :data:`WARMUP_REQUESTS` short requests go straight to the
target, so that the first configuration does not alone pay the engine's first-request costs
(vLLM's first requests after start are several times slower). Then it writes the comparison
(``comparison.json``, ``comparison.md``; ``harness.outputs``) into ``<run>/`` and stops the
target. With shaped links the network is built once for every configuration
(:func:`run_comparison`).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from harness.analysis import Comparison, compare
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
from harness.lifecycle._inputs import url_target
from harness.lifecycle._netrun import RunNetwork, plan_network
from harness.lifecycle._placement import (
    Placement,
    pinned_to_load,
    place_target,
    plan_placement,
)
from harness.lifecycle._run import RunLifecycle
from harness.lifecycle._runinfo import host_facts, versions
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.outputs import write_comparison
from harness.runfolder import (
    COMPARISON_RUN_JSON,
    SCENARIO_TOML,
    keep_plugins,
    new_run_dir,
    write_json,
)
from harness.scenario import NamedProxyConfig, Scenario, ScenarioError, needs_baseline
from harness.servers import Target, make_target
from loadgen import FullSpeed, RequestSpec, build_prompt, prompt_seed, stream_request
from zwcore import NetworkError, TargetError

IDLE_TIMEOUT_S = 120.0
WARMUP_REQUESTS = 3


@dataclass
class ComparisonResult:
    """What a comparison run produced: the parent folder, each configuration's run (by name,
    in run order), the comparison (``None`` if no configuration ran) and the exit code
    (0 all complete, 1 one failed, 2 the target could not start, 130 interrupted)."""

    run_dir: Path
    runs: dict[str, RunResult] = field(default_factory=dict)
    comparison: Comparison | None = None
    exit_code: int = EXIT_OK
    failure: str | None = None


def healthy_groups(scenario: Scenario) -> list[str]:
    """Groups of healthy readers: full-speed reads, no client action (stalls, closes)."""
    return [g.name for g in scenario.groups if isinstance(g.read, FullSpeed) and g.action is None]


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


def run_comparison(
    scenario: Scenario,
    *,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    target_url: str | None = None,
    distribution: Distribution | None = None,
) -> ComparisonResult:
    """Run ``scenario`` through each of its ``proxies`` (module docstring) under
    ``out_root/<name>/<UTC timestamp>/``.

    When the scenario needs its own network (network profiles, ``[server_net]``, ``[netem]
    isolate``), it is built once before the target starts and kept for every configuration:
    the target and each proxy listen in the server's namespace, each group's load runs in its
    own behind the same shaped link, and each configuration's ``run.json`` holds the links'
    requested and measured figures (measured once). ``distribution`` runs each group of each
    configuration as a Locust master with local workers (in the group's namespace when there
    is one). Never raises for failures of the target, a proxy, the network or the load: they
    end up in ``comparison-run.json``, the runs' ``run.json`` and the exit code. Raises, before
    anything starts, :class:`~harness.scenario._models.ScenarioError` for an invalid
    ``target_url``, gates relative to a baseline, or a network the target cannot join (a
    ``url`` target); :class:`~harness.lifecycle.DistributedError` for remote workers (they
    quit with their master after each configuration); ``ValueError`` if the scenario lists no
    ``proxies``."""
    if not scenario.proxies:
        raise ValueError("the scenario lists no proxies")
    if needs_baseline(scenario.gates):
        raise ScenarioError(
            "proxies = [...]: gates that refer to 'baseline' are not supported in a comparison "
            "yet (each configuration is gated on its own figures); use absolute bounds"
        )
    if target_url is not None:
        scenario = scenario.model_copy(update={"target": url_target(scenario, target_url)})
    scenario, network = plan_network(scenario)
    if distribution is not None:
        distribution.check_for_comparison()
        if network is not None:
            distribution.check_in_namespaces()
    run_dir = new_run_dir(out_root, scenario.name)
    if scenario_path is not None:
        shutil.copyfile(scenario_path, run_dir / SCENARIO_TOML)
    keep_plugins(run_dir, scenario.plugins)
    target = make_target(scenario.target)
    placement = plan_placement(scenario.placement, target_started=bool(target.processes()))
    place_target(placement, target.processes())
    result = ComparisonResult(run_dir)
    info: dict[str, Any] = {
        "scenario": scenario.model_dump(mode="json"),
        "configurations": [p.name for p in scenario.proxies],
        "versions": versions(),
        "host": host_facts(),
        "started_utc": datetime.now(UTC).isoformat(),
        "idle_wait_s": {},
        "placement": placement.describe(),
    }
    with signals_raise(), pinned_to_load(placement):
        try:
            _start_target(target, network, run_dir)
            info["warmup"] = warm_up(target.base_url, target.served_model_name)
            _run_each(
                scenario, scenario_path, run_dir, target, result, info, placement,
                network=network, distribution=distribution,
            )  # fmt: skip
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
                info["network"] = network.describe()
    info["target"] = target.describe()
    info["engine_probe"] = target.engine_probe()
    if why := collect_engine_tables(run_dir, target.engine_dir, t_start=0.0):
        info["engine_probe"] = {**info["engine_probe"], "status": "failed", "reason": why}
    if result.runs:
        kinds = {p.name: p.proxy.kind for p in scenario.proxies}
        result.comparison = compare(
            {n: r.summary for n, r in result.runs.items()},
            kinds=kinds,
            healthy_groups=healthy_groups(scenario),
        )
        write_comparison(result.comparison, run_dir, title=scenario.name)
    info.update(
        exit_code=result.exit_code,
        failure=result.failure,
        ended_utc=datetime.now(UTC).isoformat(),
    )
    write_json(run_dir / COMPARISON_RUN_JSON, info)
    return result


def _start_target(target: Target, network: RunNetwork | None, run_dir: Path) -> None:
    """Build the network (if any), then start the target inside its server namespace."""
    if network is None:
        target.start(run_dir)
        return
    network.setup(run_dir)
    for process in target.processes():
        process.netns = network.server_netns
    try:
        target.start(run_dir)
    finally:
        for process in target.processes():
            network.record_process(process.proc, process.label)


def run_configuration(
    scenario: Scenario,
    scenario_path: Path | None,
    run_dir: Path,
    target: Target,
    proxy: NamedProxyConfig,
    *,
    placement: Placement | None = None,
    network: RunNetwork | None = None,
    distribution: Distribution | None = None,
) -> RunResult:
    """Run ``scenario``'s load through ``proxy`` against ``target``, which is already running
    (inside ``network``'s server namespace, if given) and is left running with its network
    (one configuration of a comparison), and conclude it in ``run_dir`` (gated on its own
    figures: relative gates are refused for comparisons up front)."""
    run = RunLifecycle(
        scenario,
        scenario_path,
        run_dir,
        target,
        proxy=proxy,
        manage_target=False,
        network=network,
        distribution=distribution,
        placement=placement,
    )
    facts = run.execute()
    return conclude(run_dir, facts, run.info, setup_failed=run.setup_failed)


def _run_each(
    scenario: Scenario,
    scenario_path: Path | None,
    run_dir: Path,
    target: Target,
    result: ComparisonResult,
    info: dict[str, Any],
    placement: Placement,
    *,
    network: RunNetwork | None,
    distribution: Distribution | None,
) -> None:
    for named in scenario.proxies:
        if reason := target.failure():
            raise TargetError(reason)
        waited = wait_idle(target.base_url)
        info["idle_wait_s"][named.name] = waited
        sub_dir = run_dir / named.name
        sub_dir.mkdir()
        outcome = run_configuration(
            scenario, scenario_path, sub_dir, target, named,
            placement=placement, network=network, distribution=distribution,
        )  # fmt: skip
        result.runs[named.name] = outcome
        if outcome.exit_code == EXIT_INTERRUPTED:
            raise RunInterrupted("signal")
        if outcome.exit_code != EXIT_OK:
            result.exit_code = EXIT_FAILED
            failed_gates = [g.gate for g in outcome.gates if not g.passed]
            reason = outcome.summary.failure or f"gates failed: {', '.join(failed_gates)}"
            result.failure = f"{named.name}: {reason}"
