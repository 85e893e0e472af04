"""The life cycle of one run: target, collectors and load processes for one scenario.

:class:`RunLifecycle` starts the target (or uses the one a series started), the proxy, the
collectors and one Locust process per user group, waits for the load to finish (or the
engine to die, the time bound to pass, or SIGINT/SIGTERM), then releases everything in one
``finally`` and writes what was measured: tables, ``summary.json`` and ``run.json`` with the
status and, if any, the reason the run failed.
"""

from __future__ import annotations

import shutil
import sys
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from harness.analysis import RunFacts
from harness.collectors import (
    SOCKET_COLUMNS,
    AcceleratorSampler,
    MetricsScraper,
    ProxyProbe,
    SocketSampler,
    SocketTables,
    collect_engine_tables,
    open_accelerator,
)
from harness.lifecycle._distributed import (
    EXPECT_WORKERS_MAX_WAIT_S,
    Distribution,
    start_distributed_load,
    worker_reports,
)
from harness.lifecycle._inputs import url_target
from harness.lifecycle._loadrun import LoadProcess, release_vanished, start_load
from harness.lifecycle._netrun import RunNetwork, plan_network, start_target
from harness.lifecycle._placement import Placement, pinned_to_load, place_target, plan_placement
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._runinfo import ci_facts, harness_process, host_facts, versions
from harness.lifecycle._signals import RunInterrupted, signals_raise
from harness.runfolder import (
    ACCELERATOR,
    ACCELERATOR_COLUMNS,
    ERROR_LOG,
    PROXY,
    RUN_JSON,
    SCENARIO_TOML,
    SERVER_METRICS,
    SOCKETS,
    LoadWorker,
    keep_plugins,
    new_run_dir,
    write_json,
    write_parquet,
)
from harness.scenario import (
    NamedProxyConfig,
    PlacementConfig,
    Scenario,
)
from harness.servers import Target, make_proxy, make_target, url_port
from zwcore import NetworkError, TargetError

# Scrapes in a row without an answer after which the target counts as dead.
MAX_FAILED_SCRAPES = 12


class RunLifecycle:
    """State of one run; ``execute`` is the whole life cycle.

    ``proxy`` replaces the scenario's ``proxy`` (one entry of its ``proxies``);
    ``manage_target=False`` uses a target that is already running and leaves it running, and
    with it ``network``, which the caller set up and tears down (this run only captures the
    wire into its own folder)."""

    def __init__(
        self,
        scenario: Scenario,
        scenario_path: Path | None,
        run_dir: Path,
        target: Target,
        *,
        proxy: NamedProxyConfig | None = None,
        manage_target: bool = True,
        network: RunNetwork | None = None,
        distribution: Distribution | None = None,
        placement: Placement | None = None,
    ) -> None:
        self.scenario = scenario
        self.placement = placement or plan_placement(PlacementConfig(enabled=False))
        self.distribution = distribution
        self.scenario_path = scenario_path
        self.run_dir = run_dir
        self.target = target
        self.manage_target = manage_target
        self.proxy_name = proxy.name if proxy else scenario.proxy.kind
        self.proxy_kind = proxy.proxy.kind if proxy else scenario.proxy.kind
        self.proxy = make_proxy(proxy.proxy if proxy else scenario.proxy)
        self.probes: list[ProxyProbe] = []  # one per hop of the proxy
        self.client_url = target.base_url
        self.client_port: int | None = None
        self.network = network
        self.loads: list[LoadProcess] = []
        self.scraper: MetricsScraper | None = None
        self.sockets: SocketSampler | None = None
        self.accelerator: AcceleratorSampler | None = None
        self.status = "complete"
        self.failure: str | None = None
        self.setup_failed = False
        self.duration_s = 0.0
        self.workers: list[LoadWorker] = []
        self.t_start = self.t_load = self.t_finish = time.monotonic()
        self.progress: RunProgress | None = None
        self.phase = "starting target"
        self.info: dict[str, Any] = {
            "scenario": scenario.model_dump(mode="json"),
            "scenario_path": str(scenario_path) if scenario_path else None,
            "argv": sys.argv,
            "versions": versions(target),
            "host": host_facts(),
            "ci": ci_facts(),
            "harness": harness_process(),
            "started_utc": datetime.now(UTC).isoformat(),
            "clock": {"monotonic_at_start_s": self.t_start, "wall_at_start_s": time.time()},
            "status": "running",
            "placement": self.placement.describe(),
        }

    # -- phases -------------------------------------------------------------------------

    def _start_target(self) -> None:
        if self.manage_target:  # else the caller started it, and built its network
            place_target(self.placement, self.target.processes())
            start_target(self.target, self.network, self.run_dir)
        netns = None
        if self.network is not None:
            self.network.start_captures(self.run_dir)
            netns = self.network.server_netns
            for process in self.proxy.processes():
                process.netns = netns
        self.client_url = self.proxy.start(self.run_dir, self.target.base_url)
        if self.network is not None:
            for process in self.proxy.processes():
                self.network.record_process(process.proc, process.label)
        # Undelivered bytes wait in the sockets that face the clients (the proxy's, if any).
        port = self.client_port = url_port(self.client_url)
        hops = self.proxy.probe_hops(self.run_dir, self.client_url, self.target.base_url)
        self.info["proxy_hops"] = [hop.describe() for hop in hops]
        c = self.scenario.collectors
        self.scraper = MetricsScraper(
            self.target.base_url,
            reader=self.target,
            interval_s=c.metrics_interval_s,
            slots=self.target.serves_slots,
            pid=self.target.pid(),
        )
        # the clients', the target's and every hop's listening port
        ports = {port, url_port(self.target.base_url), *(hop.listen_port for hop in hops)}
        self.sockets = SocketSampler(ports, interval_s=c.sockets_interval_s, netns=netns)
        self.scraper.start()
        self.sockets.start()
        tables = SocketTables(max_age_s=c.metrics_interval_s / 2)  # one read per tick for all
        self.probes = [ProxyProbe(h, interval_s=c.metrics_interval_s, tables=tables) for h in hops]
        for probe in self.probes:
            probe.start()

    def _tick(self, phase: str | None = None) -> None:
        """Report to the progress display, if any (called from every wait loop)."""
        self.phase = phase or self.phase
        if self.progress is not None:
            latest = self.scraper.rows[-1] if self.scraper and self.scraper.rows else None
            t_load = None if self.phase == "starting target" else self.t_load
            try:
                self.progress.update(self.phase, t_load=t_load, metrics=latest)
            except RunInterrupted:
                raise
            except Exception:  # noqa: BLE001 - a broken display must not fail the run
                self.progress = None

    def _start_load(self) -> None:
        self.t_load = t_load = time.monotonic()
        self._tick("load")
        for group in sorted(self.scenario.groups, key=lambda g: g.start_after_s):
            self._sleep_checking(t_load + group.start_after_s - time.monotonic())
            common: dict[str, Any] = {
                "run_dir": self.run_dir,
                "host": self.client_url,
                "model": self.target.served_model_name,
                "seed": self.scenario.seed,
                "max_duration_s": self.scenario.max_duration_s,
                "plugins": list(self.scenario.plugins),
            }
            common["netns"] = self.network.group_netns(group.name) if self.network else None
            if self.distribution is None:
                load = start_load(group, **common)
            else:
                index = self.scenario.groups.index(group)  # port+i: i is the order in the file
                load = start_distributed_load(group, **common, **self.distribution.for_group(index))
            self.loads.append(load)
            if self.network is not None:
                for proc, what in load.processes():
                    self.network.record_process(proc, what)

    def _target_failure(self) -> str | None:
        reason = self.target.failure() or self.proxy.failure()
        if (
            reason is None
            and self.scraper
            and self.scraper.consecutive_failures >= MAX_FAILED_SCRAPES
        ):
            reason = (
                f"target stopped answering {self.target.base_url}/metrics "
                f"({self.scraper.last_error})"
            )
        return reason

    def _sleep_checking(self, duration_s: float) -> None:
        """Sleep ``duration_s`` seconds, raising :class:`TargetError` if the target fails."""
        end = time.monotonic() + duration_s
        while (left := end - time.monotonic()) > 0:
            if reason := self._target_failure():
                raise TargetError(reason)
            self._tick()
            time.sleep(min(0.2, left))

    def _wait(self) -> None:
        deadline = self.t_load + self.scenario.max_duration_s + 30
        if self.distribution is not None and self.distribution.remote_workers:
            deadline += EXPECT_WORKERS_MAX_WAIT_S  # the masters' clocks start once all joined
        while any(load.running() for load in self.loads):
            if reason := self._target_failure():
                raise TargetError(reason)
            if time.monotonic() > deadline:
                raise TargetError(
                    f"load did not finish within max_duration_s={self.scenario.max_duration_s:g}"
                )
            self._tick()
            time.sleep(0.2)
        self._tick("cooldown")
        self._sleep_checking(self.scenario.cooldown_s)

    def execute(self) -> RunFacts:
        """The whole life cycle: start, load, wait, and in every case release everything and
        write the samples. Returns the :class:`~harness.analysis.RunFacts` for analysis;
        never raises for failures of the target, the proxy, the network or the load."""
        interval_s = self.scenario.collectors.metrics_interval_s
        self.info["accelerator"], self.accelerator = open_accelerator(interval_s=interval_s)
        if self.accelerator is not None:
            self.accelerator.start()
        write_json(self.run_dir / RUN_JSON, self.info)
        started = False
        with signals_raise() as received, pinned_to_load(self.placement):
            try:
                self._tick("starting target")
                self._start_target()
                started = True
                self._start_load()
                self._wait()
            except RunInterrupted as exc:
                self.status, self.failure = "interrupted", f"stopped by {exc}; partial results kept"
            except (TargetError, NetworkError) as exc:
                self.status, self.setup_failed = "failed", not started
                prefix = "network: " if isinstance(exc, NetworkError) else ""
                self.failure = f"{prefix}{exc}"
            except OSError as exc:
                self.status, self.setup_failed = "failed", True
                self.failure = f"cannot start the run: {exc}"
            except Exception as exc:  # a bug: keep what was measured, and say so
                self.status = "failed"
                self.failure = f"internal error {type(exc).__name__}: {exc} (see {ERROR_LOG})"
                (self.run_dir / ERROR_LOG).write_text(traceback.format_exc())
            finally:
                facts = self._finish()
            if received and self.status == "complete":
                self.status = "interrupted"
                facts = self._facts()
        return facts

    def _finish(self) -> RunFacts:
        """Release everything, then write the samples. Runs once, in ``finally``."""
        self.t_finish = time.monotonic()  # the load and its cool-down are over
        try:
            self._tick("writing results")
        except Exception:  # noqa: BLE001 - progress is best effort; a signal here is ignored
            pass
        ended = [load.proc.poll() for load in self.loads]  # before the run stops them
        for load in self.loads:
            load.stop()
        if self.loads:
            groups = [g.name for g in self.scenario.groups]
            netns = [self.network.group_netns(g) for g in groups] if self.network else []
            release_vanished(self.run_dir, [None, *netns])
        for sampler in (self.scraper, self.sockets, self.accelerator, *self.probes):
            if sampler is not None:
                sampler.stop()
        self.proxy.stop()
        if self.manage_target:
            self.target.stop()
        if self.network is not None:
            if self.manage_target:
                self.network.teardown(self.run_dir)
            else:
                self.network.finish_captures(self.run_dir)
            self.info["network"] = self.network.describe()
        self.info["proxy"] = self.proxy.describe()
        self.info["load_processes"] = [ld.describe() for ld in self.loads]
        self.info["target"] = self.target.describe()
        self.info["engine_probe"] = self._engine_tables()
        self.info["ended_utc"] = datetime.now(UTC).isoformat()
        metrics = pd.DataFrame(self.scraper.rows if self.scraper else [])
        if "scrape_ok" not in metrics:
            metrics = pd.DataFrame(
                {"t": pd.Series(dtype=float), "scrape_ok": pd.Series(dtype=bool)}
            )
        sockets = pd.DataFrame(self.sockets.rows if self.sockets else [], columns=SOCKET_COLUMNS)
        write_parquet(metrics, self.run_dir / SERVER_METRICS)
        write_parquet(sockets, self.run_dir / SOCKETS)
        if self.probes:  # a proxy stood in between: its hops' samples, in time order
            rows = sorted((r for p in self.probes for r in p.rows), key=lambda r: r["t"])
            write_parquet(pd.DataFrame(rows), self.run_dir / PROXY)
        self._write_accelerator()
        self.workers = [w for ld in self.loads for w in worker_reports(ld, self.run_dir)]
        died = [w.message for w in self.workers if w.status != "finished"]
        died += [m for ld, code in zip(self.loads, ended, strict=True) if (m := ld.death(code))]
        if died and self.status == "complete":
            self.status, self.failure = "failed", "; ".join(died)
        self.duration_s = time.monotonic() - self.t_start
        return self._facts()

    def _write_accelerator(self) -> None:
        """The GPUs' samples, where there are GPUs; a sampling that NVML ended is a warning."""
        if (gpus := self.accelerator) is None:
            return
        rows = pd.DataFrame(gpus.rows, columns=list(ACCELERATOR_COLUMNS))
        write_parquet(rows, self.run_dir / ACCELERATOR)
        if gpus.error is not None:
            self.info["accelerator"]["sampling_error"] = gpus.error
            print(f"warning: {gpus.error}", file=sys.stderr)

    def _engine_tables(self) -> dict[str, Any]:
        """Bring the engine's own tables into the run folder; ``run.json``'s
        ``engine_probe``."""
        probe = self.target.engine_probe()
        why = collect_engine_tables(
            self.run_dir, self.target.engine_dir, t_start=self.t_start, t_end=self.t_finish
        )
        return probe if why is None else {**probe, "status": "failed", "reason": why}

    def _facts(self) -> RunFacts:
        return RunFacts(
            scenario=self.scenario,
            status=self.status,
            failure=self.failure,
            duration_s=self.duration_s,
            proxy_name=self.proxy_name,
            proxy_kind=self.proxy_kind,
            client_port=self.client_port,
            missing_metrics=self.scraper.missing() if self.scraper else [],
            stalled_flows=self.network.stalled_flows if self.network else None,
            load_workers=self.workers,
            placement=self.placement.describe(),
            engine_probe=self.info.get("engine_probe"),
            hops=list(self.info.get("proxy_hops", [])),
            accelerator=self.info.get("accelerator"),
        )


@dataclass(frozen=True)
class RunPlan:
    """What a run (or a series of runs) will start, decided before anything starts."""

    scenario: Scenario  # as it will run: the --target-url target, listening addresses moved
    target: Target
    network: RunNetwork | None
    placement: Placement


def plan_run(
    scenario: Scenario, *, target_url: str | None, distribution: Distribution | None
) -> RunPlan:
    """The target (``target_url``: an already running server instead of the scenario's), the
    network the scenario needs, if any, and the CPU placement. Raises :class:`ScenarioError`
    for an invalid ``target_url``, a target that cannot run inside the network, or a
    ``[placement]`` naming CPUs that are not usable (a ``distribution`` that cannot run in the
    groups' namespaces is refused by :func:`~harness.scenario.make_plan`)."""
    if target_url is not None:
        scenario = scenario.model_copy(update={"target": url_target(scenario, target_url)})
    scenario, network = plan_network(scenario)
    target = make_target(scenario.target)
    placement = plan_placement(scenario.placement, target_started=bool(target.processes()))
    return RunPlan(scenario, target, network, placement)


def open_run_dir(out_root: Path, scenario: Scenario, scenario_path: Path | None) -> Path:
    """A new run folder ``out_root/<name>/<UTC timestamp>/`` with the scenario file and its
    file plugins copied in. Raises ``OSError`` if it cannot be written."""
    run_dir = new_run_dir(out_root, scenario.name)
    if scenario_path is not None:
        shutil.copyfile(scenario_path, run_dir / SCENARIO_TOML)
    keep_plugins(run_dir, scenario.plugins)
    return run_dir
