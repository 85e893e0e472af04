"""One workload through several proxy configurations against one target: ``proxies = [...]``.

:func:`run_comparison` starts the scenario's target once, then for each entry of the
scenario's ``proxies`` in turn waits until the engine is idle (no running or waiting request),
starts that proxy and runs the scenario's groups through it into ``<run>/<name>/`` (a complete
run folder each: tables, ``summary.json``, ``run.json``, the scenario's gates evaluated on
that configuration's figures in ``gates.json``/``junit.xml``, ``report.html``), and stops the
proxy. The workload is identical in each: the load processes are started afresh with the same
seed, so the same users send the same prompts (``loadgen._prompt``: seeded by run seed, group,
user and request index) on the same schedule (spawn rate, ``start_after_s``, ``wait_s``).
The target, its warm-up and its network are a series's (``harness.lifecycle._series``). Then
it writes the comparison
(``comparison.json``, ``comparison.md``; ``harness.outputs``) into ``<run>/`` and stops the
target. With shaped links the network is built once for every configuration
(:func:`run_comparison`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.analysis import Comparison, compare
from harness.lifecycle._conclude import EXIT_OK, RunResult
from harness.lifecycle._distributed import Distribution
from harness.lifecycle._series import Series, run_series
from harness.outputs import write_comparison
from harness.runfolder import COMPARISON_RUN_JSON
from harness.scenario import Scenario, ScenarioError, needs_baseline
from loadgen import FullSpeed


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
    anything starts, ``ValueError`` if the scenario lists no ``proxies``,
    :class:`~harness.scenario._models.ScenarioError` for gates relative to a baseline, and
    what :func:`~harness.lifecycle._series.run_series` raises."""
    if not scenario.proxies:
        raise ValueError("the scenario lists no proxies")
    if needs_baseline(scenario.gates):
        raise ScenarioError(
            "proxies = [...]: gates that refer to 'baseline' are not supported in a comparison "
            "yet (each configuration is gated on its own figures); use absolute bounds"
        )

    def each(series: Series) -> None:
        for named in series.scenario.proxies:
            series.run(named.name, proxy=named)

    done = run_series(
        scenario, each,
        record=COMPARISON_RUN_JSON, scenario_path=scenario_path, out_root=out_root,
        target_url=target_url, distribution=distribution,
        info={"configurations": [p.name for p in scenario.proxies]},
    )  # fmt: skip
    result = ComparisonResult(done.run_dir, done.runs, None, done.exit_code, done.failure)
    if result.runs:
        kinds = {p.name: p.proxy.kind for p in scenario.proxies}
        result.comparison = compare(
            {n: r.summary for n, r in result.runs.items()},
            kinds=kinds,
            healthy_groups=healthy_groups(scenario),
        )
        write_comparison(result.comparison, result.run_dir, title=scenario.name)
    return result
