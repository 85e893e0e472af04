"""The run orchestrator: target, collectors and load processes for one scenario.

``run_scenario`` creates the run folder, starts the target, the collectors and one Locust
process per user group, waits for the load to finish (or the engine to die, the time bound to
pass, or SIGINT/SIGTERM), then releases everything in one ``finally`` and writes what was
measured: tables, ``summary.json`` and ``run.json`` with the status and, if any, the reason
the run failed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any
from urllib.parse import urlsplit

import pandas as pd
from pydantic import ValidationError

from harness.gates._baseline import Baseline, baseline_path, load_baseline
from harness.collectors._collectors import SOCKET_COLUMNS, MetricsScraper, SocketSampler
from harness.lifecycle._distributed import (
    EXPECT_WORKERS_MAX_WAIT_S,
    Distribution,
    start_distributed_load,
    worker_reports,
)
from harness.runfolder import figures
from harness.gates._evaluate import GateResult, evaluate_gates
from harness.scenario import needs_baseline
from harness.outputs._junit import write_junit
from harness.lifecycle._loadrun import LoadProcess, start_load
from harness.lifecycle._netrun import RunNetwork, plan_network
from harness.lifecycle._progress import RunProgress
from harness.servers import make_proxy
from harness.collectors._proxy_probe import ProxyProbe, proxy_summary
from harness.outputs._report import report_or_warning
from harness.lifecycle._runinfo import host_facts, versions
from harness.analysis._saturation import saturation_summary
from harness.scenario import NamedProxyConfig, Scenario
from harness.servers import UrlTargetConfig
from harness.scenario import ScenarioError
from harness.analysis._stalls import abort_times, attribute_aborts
from harness.runfolder import RunSummary, to_builtin
from harness.analysis._summary import group_names, summarize_group, summarize_server
from harness.analysis._tables import chunks_frame, load_records, requests_frame
from harness.runfolder import write_parquet
from harness.servers import Target, make_target
from zwcore import TargetError
from harness.analysis._verdicts import kv_held_verdict
from loadgen import group_files
from netem import NetemError

# Exit codes of `zerowindow run`.
EXIT_OK, EXIT_FAILED, EXIT_SETUP, EXIT_INTERRUPTED = 0, 1, 2, 130
# Scrapes in a row without an answer after which the target counts as dead.
MAX_FAILED_SCRAPES = 12


class RunInterrupted(Exception):
    """SIGINT or SIGTERM arrived during a run."""


@dataclass
class RunResult:
    """What a run produced: its folder, summary, the exit code `zerowindow run` returns, the
    scenario's gates evaluated and the baseline file they used (if any)."""

    run_dir: Path
    summary: RunSummary
    exit_code: int
    gates: list[GateResult] = field(default_factory=list)
    baseline: Path | None = None

    @property
    def figures(self) -> dict[str, float | None]:
        """The run's figures by name (see :mod:`harness.runfolder._figures`)."""
        return figures(self.summary)

    @property
    def gates_passed(self) -> bool:
        """Whether every gate passed (true when there are none)."""
        return all(g.passed for g in self.gates)


@contextmanager
def _signals_raise() -> Iterator[list[str]]:
    """Turn the first SIGINT/SIGTERM into :class:`RunInterrupted`; ignore later ones so that
    clean-up finishes. Yields a list that receives the signal names."""
    received: list[str] = []
    owner = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            # A forked child (pyroute2 forks to enter namespaces) inherits this handler; the
            # exception would unwind the child through the run's clean-up. It just exits.
            os._exit(128 + signum)
        received.append(signal.Signals(signum).name)
        if len(received) == 1:
            raise RunInterrupted(received[0])

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def new_run_dir(out_root: Path, scenario: str) -> Path:
    """``out_root/<scenario>/<UTC timestamp>/``, created; a suffix keeps it unique."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out_root / scenario / stamp
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{stamp}-{n}")
    run_dir.mkdir(parents=True)
    return run_dir


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(to_builtin(data), indent=2, default=str) + "\n")


class _Run:
    """State of one run; ``execute`` is the whole life cycle.

    ``proxy`` replaces the scenario's ``proxy`` (one entry of its ``proxies``);
    ``manage_target=False`` uses a target that is already running and leaves it running."""

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
    ) -> None:
        self.scenario = scenario
        self.distribution = distribution
        self.scenario_path = scenario_path
        self.run_dir = run_dir
        self.target = target
        self.manage_target = manage_target
        self.proxy_name = proxy.name if proxy else scenario.proxy.kind
        self.proxy_kind = proxy.proxy.kind if proxy else scenario.proxy.kind
        self.proxy = make_proxy(proxy.proxy if proxy else scenario.proxy)
        self.probe: ProxyProbe | None = None
        self.client_url = target.base_url
        self.client_port: int | None = None
        self.network = network
        self.loads: list[LoadProcess] = []
        self.scraper: MetricsScraper | None = None
        self.sockets: SocketSampler | None = None
        self.status = "complete"
        self.failure: str | None = None
        self.exit_code = EXIT_OK
        self.t_start = self.t_load = time.monotonic()
        self.progress: RunProgress | None = None
        self.phase = "starting target"
        self.info: dict[str, Any] = {
            "scenario": scenario.model_dump(mode="json"),
            "scenario_path": str(scenario_path) if scenario_path else None,
            "argv": sys.argv,
            "versions": versions(),
            "host": host_facts(),
            "started_utc": datetime.now(UTC).isoformat(),
            "clock": {"monotonic_at_start_s": self.t_start, "wall_at_start_s": time.time()},
            "status": "running",
        }

    # -- phases -------------------------------------------------------------------------

    def _start_target(self) -> None:
        netns = None
        if self.network is not None:
            self.network.setup(self.run_dir)
            netns = self.network.server_netns
            for process in self.target.processes() + self.proxy.processes():
                process.netns = netns
        if self.manage_target:
            self.target.start(self.run_dir)
        self.client_url = self.proxy.start(self.run_dir, self.target.base_url)
        if self.network is not None:
            for process in self.target.processes() + self.proxy.processes():
                self.network.record_process(process.proc, process.label)
        # Undelivered bytes wait in the sockets that face the clients (the proxy's, if any).
        url = urlsplit(self.client_url)
        port = self.client_port = url.port or (443 if url.scheme == "https" else 80)
        target_port = urlsplit(self.target.base_url).port or port
        c = self.scenario.collectors
        self.scraper = MetricsScraper(self.target.base_url, interval_s=c.metrics_interval_s)
        self.sockets = SocketSampler(
            {port, target_port}, interval_s=c.sockets_interval_s, netns=netns
        )
        self.scraper.start()
        self.sockets.start()
        if self.client_url != self.target.base_url:  # a proxy stands in between
            self.probe = ProxyProbe(
                pid=self.proxy.pid(),
                client_port=port,
                target_port=target_port,
                metrics_url=self.proxy.metrics_url,
                temp_dir=self.proxy.spill_dir(self.run_dir),
                interval_s=c.metrics_interval_s,
            )
            self.probe.start()

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
            }
            if self.distribution is None:
                netns = self.network.group_netns(group.name) if self.network else None
                self.loads.append(start_load(group, **common, netns=netns))
                if self.network is not None:
                    self.network.record_process(self.loads[-1].proc, f"locust {group.name}")
            else:
                index = self.scenario.groups.index(group)  # port+i: i is the order in the file
                self.loads.append(
                    start_distributed_load(group, **common, **self.distribution.for_group(index))
                )

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

    def execute(self) -> RunResult:
        _write_json(self.run_dir / "run.json", self.info)
        started = False
        with _signals_raise() as received:
            try:
                self._tick("starting target")
                self._start_target()
                started = True
                self._start_load()
                self._wait()
            except RunInterrupted as exc:
                self.status, self.exit_code = "interrupted", EXIT_INTERRUPTED
                self.failure = f"stopped by {exc}; partial results kept"
            except TargetError as exc:
                self.status = "failed"
                self.exit_code = EXIT_FAILED if started else EXIT_SETUP
                self.failure = str(exc)
            except NetemError as exc:
                self.status = "failed"
                self.exit_code = EXIT_FAILED if started else EXIT_SETUP
                self.failure = f"network: {exc}"
            except OSError as exc:
                self.status, self.exit_code = "failed", EXIT_SETUP
                self.failure = f"cannot start the run: {exc}"
            except Exception as exc:  # a bug: keep what was measured, and say so
                self.status, self.exit_code = "failed", EXIT_FAILED
                self.failure = f"internal error {type(exc).__name__}: {exc} (see error.log)"
                (self.run_dir / "error.log").write_text(traceback.format_exc())
            finally:
                summary = self._finish()
            if received and self.status == "complete":
                self.status = "interrupted"
        return RunResult(self.run_dir, summary, self.exit_code)

    def _finish(self) -> RunSummary:
        """Release everything, then write what was measured. Runs once, in ``finally``."""
        try:
            self._tick("writing results")
        except Exception:  # noqa: BLE001 - progress is best effort; a signal here is ignored
            pass
        for load in self.loads:
            load.stop()
        for sampler in (self.scraper, self.sockets, self.probe):
            if sampler is not None:
                sampler.stop()
        self.proxy.stop()
        if self.manage_target:
            self.target.stop()
        if self.network is not None:
            self.network.teardown(self.run_dir)
            self.info["network"] = self.network.describe()
        self.info["proxy"] = self.proxy.describe()
        self.info["client_facing_port"] = self.client_port
        self.info["load_processes"] = [ld.describe() for ld in self.loads]
        self.info["target"] = self.target.describe()
        return self._write_results()

    def _write_results(self) -> RunSummary:
        metrics = pd.DataFrame(self.scraper.rows if self.scraper else [], columns=None)
        if "scrape_ok" not in metrics:
            metrics = pd.DataFrame(
                {"t": pd.Series(dtype=float), "scrape_ok": pd.Series(dtype=bool)}
            )
        sockets = pd.DataFrame(
            self.sockets.rows if self.sockets else [],
            columns=SOCKET_COLUMNS,
        )
        groups = [g.name for g in self.scenario.groups]
        records = load_records(p for g in groups for p in group_files(self.run_dir, "records", g))
        # Requests meet the server on the client-facing port (the proxy's, if any).
        client_sockets = sockets[sockets["local_port"] == self.client_port]
        requests = requests_frame(records, client_sockets)
        requests = attribute_aborts(requests, abort_times(metrics, requests["t_send"]))
        chunks = chunks_frame(records)
        for frame, name in (
            (requests, "requests"),
            (chunks, "chunks"),
            (metrics, "server_metrics"),
            (sockets, "sockets"),
        ):
            write_parquet(frame, self.run_dir / f"{name}.parquet")
        t_first_send = float(requests["t_send"].min()) if len(requests) else None
        # Only the load's own connections: not the scraper's, nor anyone else's.
        load_sockets = client_sockets[
            client_sockets["client_port"].isin(requests["client_port"].dropna())
        ]
        verdict = kv_held_verdict(
            metrics,
            load_sockets,
            t_first_send=t_first_send,
            generation_bound_s=self.scenario.verdict.generation_bound_s,
            min_observe_s=self.scenario.verdict.min_observe_s,
        )
        names = group_names(requests, groups)
        workers = [w for ld in self.loads for w in worker_reports(ld, self.run_dir)]
        died = [w.message for w in workers if w.status != "finished"]
        if died and self.status == "complete":
            self.status, self.exit_code = "failed", EXIT_FAILED
            self.failure = "; ".join(died)
        if self.status == "complete" and (reason := _all_requests_failed(requests)):
            self.status, self.exit_code, self.failure = "failed", EXIT_FAILED, reason
        summary = RunSummary(
            scenario=self.scenario.name,
            status=self.status,
            failure=self.failure,
            duration_s=time.monotonic() - self.t_start,
            groups=[summarize_group(n, requests, chunks) for n in names],
            server=summarize_server(
                metrics, self.scraper.missing() if self.scraper else [], requests
            ),
            verdicts={"kv_held_by_undelivered_streams": verdict.as_dict()},
            client_saturation=saturation_summary(
                [p for g in groups for p in _saturation_files(self.run_dir, g)]
            ),
            proxy=proxy_summary(
                self.proxy_name, self.proxy_kind, self.probe.rows if self.probe else []
            ),
            stalled_flows=self.network.stalled if self.network and self.network.captures else None,
            load_workers=workers,
        )
        if self.probe is not None:
            write_parquet(pd.DataFrame(self.probe.rows), self.run_dir / "proxy.parquet")
        _write_json(self.run_dir / "summary.json", summary.model_dump(mode="json"))
        self.info.update(
            status=self.status,
            failure=self.failure,
            exit_code=self.exit_code,
            client_saturated=summary.client_saturation.saturated,
            client_saturation=summary.client_saturation.message,
            ended_utc=datetime.now(UTC).isoformat(),
        )
        _write_json(self.run_dir / "run.json", self.info)
        return summary


def _saturation_files(run_dir: Path, group: str) -> list[Path]:
    # A group that was never sampled still names its file, so that the summary says so.
    return group_files(run_dir, "saturation", group) or [run_dir / f"saturation-{group}.jsonl"]


def url_target(scenario: Scenario, url: str) -> UrlTargetConfig:
    """The scenario's target replaced by the server at ``url``. Raises :class:`ScenarioError`
    if ``url`` is not an http(s) URL."""
    try:
        return UrlTargetConfig(
            kind="url", url=url, served_model_name=scenario.target.served_model_name
        )
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ScenarioError(f"--target-url {url!r}: {reason}") from None


def _all_requests_failed(requests: pd.DataFrame) -> str | None:
    """Why the run measured nothing when every request got an HTTP error (a wrong model name,
    a wrong URL), else ``None``."""
    if not len(requests) or set(requests["outcome"]) != {"http_error"}:
        return None
    first = requests["error"].dropna()
    detail = f": {str(first.iloc[0])[:300]}" if len(first) else ""
    return f"every request ({len(requests)}) got an HTTP error{detail}"


def _baseline_for(
    scenario: Scenario, path: Path | None, *, use: bool = True
) -> tuple[Path, Baseline] | None:
    """The baseline the scenario's gates need (``None`` if no gate refers to it, or not
    ``use``)."""
    if not use or not needs_baseline(scenario.gates):
        return None
    path = path or baseline_path(scenario.name)
    return path, load_baseline(path)


def _check_gates(
    run: _Run, result: RunResult, base: tuple[Path, Baseline] | None, *, skip_relative: bool
) -> None:
    """Evaluate the gates, write ``gates.json`` and ``junit.xml``, and turn a complete run
    with a failed gate into exit code 1 (recorded in ``run.json``)."""
    result.baseline = base[0] if base else None
    result.gates = evaluate_gates(
        run.scenario.gates,
        result.figures,
        base[1].figures if base else None,
        baseline_source=f"baseline {base[0]}" if base else "the baseline",
        skip_relative=skip_relative,
    )
    if result.exit_code == EXIT_OK and not result.gates_passed:
        result.exit_code = EXIT_FAILED
    _write_json(
        run.run_dir / "gates.json",
        {
            "baseline": str(result.baseline) if result.baseline else None,
            "baseline_provenance": base[1].provenance if base else None,
            "gates": [vars(g) for g in result.gates],
        },
    )
    write_junit(
        run.run_dir / "junit.xml",
        result.summary,
        result.gates,
        run_dir=run.run_dir,
        baseline=result.baseline,
    )
    run.info.update(
        exit_code=result.exit_code,
        gates={
            "passed": sum(g.passed and not g.skipped for g in result.gates),
            "failed": sum(not g.passed for g in result.gates),
            "skipped": sum(g.skipped for g in result.gates),
            "baseline": str(result.baseline) if result.baseline else None,
        },
    )
    _write_json(run.run_dir / "run.json", run.info)


def run_scenario(
    scenario: Scenario,
    *,
    scenario_path: Path | None = None,
    out_root: Path = Path("results"),
    target_url: str | None = None,
    baseline: Path | None = None,
    use_baseline: bool = True,
    progress: RunProgress | None = None,
    distribution: Distribution | None = None,
) -> RunResult:
    """Run ``scenario`` and write its run folder under ``out_root/<name>/<UTC timestamp>/``.

    ``target_url`` attaches to a running server instead of the scenario's target. When a gate
    refers to ``baseline``, the baseline file ``baseline`` (default
    ``results/baselines/<name>.json``) is loaded before anything starts; with
    ``use_baseline=False`` none is loaded and relative gates are reported as skipped (the first
    run of a scenario, to be saved as its baseline). ``progress`` shows the
    run live (see :mod:`harness.lifecycle._progress`). ``distribution`` runs each group as a Locust
    master with workers (see :class:`harness.lifecycle._distributed.Distribution`); a worker that dies
    fails the run (exit 1). Never raises for failures of the target or the
    load: they are recorded in ``run.json`` and ``summary.json`` and reflected in
    :attr:`RunResult.exit_code` (0 complete and every gate passed, 1 failed during the run or a
    gate failed, 2 could not start, 130 interrupted by SIGINT/SIGTERM). The gates are written
    to ``gates.json`` and ``junit.xml``. Raises :class:`ScenarioError` for an invalid
    ``target_url``, for ``distribution`` combined with network profiles, or for a target the
    run cannot start inside its server namespace when the scenario needs one, and
    :class:`~harness.gates._baseline.BaselineError` for a baseline that is needed but missing or
    invalid, all before anything starts.
    """
    if target_url is not None:
        scenario = scenario.model_copy(update={"target": url_target(scenario, target_url)})
    scenario, network = plan_network(scenario)
    if network is not None and distribution is not None:
        raise ScenarioError(
            "--workers cannot be combined with network profiles, [server_net] or "
            "[netem] isolate yet: distributed load processes do not run in namespaces"
        )
    base = _baseline_for(scenario, baseline, use=use_baseline)
    run_dir = new_run_dir(out_root, scenario.name)
    if scenario_path is not None:
        shutil.copyfile(scenario_path, run_dir / "scenario.toml")
    run = _Run(
        scenario,
        scenario_path,
        run_dir,
        make_target(scenario.target),
        network=network,
        distribution=distribution,
    )
    run.progress = progress
    if progress is not None:
        progress.start(
            scenario=scenario.name,
            run_dir=run_dir,
            groups=[g.name for g in scenario.groups],
            max_duration_s=scenario.max_duration_s,
        )
    try:
        result = run.execute()
    finally:
        if progress is not None:
            progress.stop()
    _check_gates(run, result, base, skip_relative=not use_baseline)
    if warning := report_or_warning(run_dir):  # after the results; never changes the result
        print(warning, file=sys.stderr)
    return result
