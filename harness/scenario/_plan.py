"""The plan: what a command will run against one target, decided before anything starts.

A plan is the list of runs against one target (one set-up, one warm-up) and the aggregate
computed from their folders. :func:`make_plan` is the one function that turns a scenario and
the options of the command line, the Python API or the pytest plugin (:class:`RunOptions`)
into a :class:`Plan`; every pair of options either composes or is refused there, by name,
with a :class:`~zwcore.ScenarioError` (exit 2), before anything starts.

Kinds of plan (``Plan.kind``):

- ``run``: one run; its folder is the run folder (a plan of one);
- ``repeats``: one configuration, its runs ``r1``, ``r2`` ... (``repeats``), each followed by
  its control run ``c1`` ... when the scenario has ``control = true``, and more repeats while a
  gate is inconclusive under ``[gating] inconclusive = "rerun"``;
- ``comparison``: the scenario's ``proxies``, each an arm in a folder of its name; each arm is
  one run, or repeats (and control runs) as above; the repeats go round the arms (r1 of every
  arm, then r2 ...), so that a drift of the machine is shared by every configuration;
- ``sweep``: one configuration at rising request rates (``zerowindow sweep``), one run per step.

An arm is **pooled** when it has more than one run (repeats, a control arm, or a rerun
policy): its runs are then ungated, and the arm's gates are judged on the evidence of all of
them (``harness.analysis._uncertainty``) into the arm's folder. An arm of one run is gated as
a single run is.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.scenario._gate_syntax import needs_baseline
from harness.scenario._models import NamedProxyConfig, Scenario
from harness.servers import ProxyConfig
from loadgen import RateArrivals
from zwcore import ScenarioError

PlanKind = Literal["run", "repeats", "comparison", "sweep"]
GOODPUT_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2el": "e2e_ms"}
"""Service-level objectives of goodput, as ``vllm bench serve --goodput`` names them, and the
request figure each bounds (vllm/benchmarks/serve.py)."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SweepSettings(_Strict):
    """What ``zerowindow sweep`` varies (``harness.lifecycle._sweep``): ``steps`` rates between
    the serial and throughput runs, or ``rates_rps``; with ``sla``, a bisection of ``sla_steps``
    steps on the rate or on a concurrency ceiling (``sla_on``); ``serial_requests`` per group in
    the serial run at most; ``goodput_slo_ms``: objectives in ms by key of
    :data:`GOODPUT_KEYS`."""

    steps: int = Field(4, ge=0)
    rates_rps: list[float] | None = None
    sla: bool = False
    sla_on: Literal["rate", "concurrency"] = "rate"
    sla_steps: int = Field(5, ge=1)
    serial_requests: int = Field(32, ge=1)
    goodput_slo_ms: dict[str, float] = {}


MASTER_BIND = "127.0.0.1:0"
"""Where a group's Locust master listens unless ``--master-bind`` says (any free port)."""


class RunOptions(_Strict):
    """What a command adds to a scenario. ``repeats`` replaces the scenario's (``None``: keep
    it); ``baseline`` is the baseline file of relative gates (default
    ``results/baselines/<scenario>.json``), ``use_baseline=False`` skips them; ``workers``,
    ``remote_workers`` and ``master_bind`` run each group as a Locust master with workers;
    ``progress`` shows each run live; ``sweep`` makes the plan a sweep; ``history`` is the
    history file its runs are added to and history gates read (``use_history=False``: none;
    see :func:`harness.history.history_path`)."""

    target_url: str | None = None
    repeats: int | None = Field(None, ge=1, le=100)
    baseline: Path | None = None
    use_baseline: bool = True
    workers: int = Field(0, ge=0)
    remote_workers: int = Field(0, ge=0)
    master_bind: str = MASTER_BIND
    progress: bool = False
    sweep: SweepSettings | None = None
    history: Path | None = None
    use_history: bool = True

    @model_validator(mode="after")
    def _one_way_to_baseline(self) -> RunOptions:
        if self.baseline is not None and not self.use_baseline:
            raise ValueError("--baseline and --no-baseline exclude each other")
        if self.history is not None and not self.use_history:
            raise ValueError("--history and --no-history exclude each other")
        if self.master_bind != MASTER_BIND and not (self.workers or self.remote_workers):
            raise ValueError(
                f"--master-bind {self.master_bind} without --workers or --remote-workers: "
                "only a group's Locust master listens there, and without workers none runs"
            )
        return self


class Arm(_Strict):
    """One configuration of a plan: its ``name`` (a ``proxies`` entry's, else the scenario's
    proxy kind), the ``proxy`` its runs go through, and ``folder``, where its runs and its
    aggregate go, relative to the plan's folder (``""``: the plan's own folder)."""

    name: str
    folder: str
    proxy: ProxyConfig


class RunEntry(_Strict):
    """One run of a plan as it ran (``plan.json``'s ``runs``, in run order): its folder
    ``path`` relative to the plan's (``"."``: the plan's own), its ``arm``, its ``role``
    (``repeat``, ``control`` or a sweep ``step``) and ``index`` (1 for ``r1``); a sweep step's
    ``phase`` (serial, throughput, rate, sla), ``offered_rps`` and ``max_concurrency``."""

    path: str
    arm: str
    role: Literal["repeat", "control", "step"]
    index: int = 1
    phase: str | None = None
    offered_rps: float | None = None
    max_concurrency: int | None = None


class Plan(_Strict):
    """A plan (module docstring). ``scenario`` is the scenario as given, gates included;
    ``confidence`` and ``bootstrap_draws`` are the one setting of every interval the plan's
    aggregate, gates and reports give (from ``[gating]``)."""

    kind: PlanKind
    scenario: Scenario
    scenario_path: str | None = None
    options: RunOptions = RunOptions()
    arms: list[Arm]
    repeats: int = Field(1, ge=1)
    control: bool = False
    max_reruns: int = 0
    confidence: float
    bootstrap_draws: int

    @property
    def pooled(self) -> bool:
        """Whether each arm has several runs, judged together (module docstring)."""
        return self.kind != "sweep" and (self.repeats > 1 or self.control or self.max_reruns > 0)

    @property
    def single(self) -> bool:
        """Whether the plan is one run, in the plan's own folder."""
        return self.kind == "run"

    def arm(self, name: str) -> Arm:
        """The arm named ``name``. Raises ``KeyError``."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise KeyError(name)

    def planned(self) -> list[str]:
        """The folders of the runs the plan makes for sure, in run order (reruns come on top
        while a gate is inconclusive; a sweep's steps are decided as it goes: its first two
        and the ``+ ...`` they lead to)."""
        if self.kind == "sweep":
            settings = self.options.sweep or SweepSettings()
            rates = len(settings.rates_rps) if settings.rates_rps is not None else settings.steps
            tail = [f"+ {rates} rate steps"] + ([f"+ up to {settings.sla_steps} sla steps"]
                                               if settings.sla else [])  # fmt: skip
            return ["serial", "throughput", *tail]
        out = []
        for index in range(1, self.repeats + 1):
            for arm in self.arms:
                out.append(self.entry(arm, "repeat", index).path)
                if self.control:
                    out.append(self.entry(arm, "control", index).path)
        if self.max_reruns:
            out.append(f"+ up to {self.max_reruns} reruns per configuration while a gate is "
                       "inconclusive")  # fmt: skip
        return out

    def describe(self) -> dict[str, object]:
        """What ``zerowindow run --dry-run`` prints: the plan's kind, its configurations, what
        runs, and every option it took."""
        return {
            "scenario": self.scenario.name,
            "kind": self.kind,
            "configurations": [a.name for a in self.arms],
            "repeats": self.repeats,
            "control": self.control,
            "max_reruns": self.max_reruns,
            "pooled": self.pooled,
            "network": self.scenario.needs_topology(),
            "runs": self.planned(),
            "confidence": self.confidence,
            "bootstrap_draws": self.bootstrap_draws,
            "options": self.options.model_dump(mode="json", exclude_defaults=True),
        }

    def entry(self, arm: Arm, role: Literal["repeat", "control"], index: int) -> RunEntry:
        """Where run ``index`` of ``arm`` goes: ``<arm>/r<i>`` (``c<i>`` for a control run),
        the arm's own folder when the arm is one run."""
        name = f"{'r' if role == 'repeat' else 'c'}{index}" if self.pooled else ""
        path = "/".join(p for p in (arm.folder, name) if p) or "."
        return RunEntry(path=path, arm=arm.name, role=role, index=index)


def _refuse(first: str, second: str, why: str) -> ScenarioError:
    return ScenarioError(f"{first} with {second}: {why}")


def _repeats_source(scenario: Scenario, options: RunOptions) -> str:
    if options.repeats is not None:
        return f"--repeats {options.repeats}"
    return f"repeats = {scenario.repeats} (the scenario)"


def _check_baseline(scenario: Scenario, options: RunOptions) -> None:
    relative = needs_baseline(scenario.gates)
    if options.baseline is not None and not relative:
        raise _refuse(
            f"--baseline {options.baseline}",
            f"scenario {scenario.name!r}",
            "no gate of the scenario refers to 'baseline', so nothing would read it",
        )
    if not options.use_baseline and not relative:
        raise _refuse(
            "--no-baseline",
            f"scenario {scenario.name!r}",
            "no gate of the scenario refers to 'baseline', so there is nothing to skip",
        )
    if relative and scenario.proxies and options.use_baseline:
        raise _refuse(
            "gates relative to 'baseline'",
            "proxies = [...]",
            "a baseline holds one configuration's figures, and a comparison has several; "
            "gate each configuration on absolute bounds, or give --no-baseline to skip them",
        )


def _check_sweep(scenario: Scenario, options: RunOptions) -> None:
    if scenario.proxies:
        raise _refuse(
            "zerowindow sweep", "proxies = [...]", "a sweep runs one proxy configuration: "
            "use [proxy], or sweep each configuration in a scenario of its own",
        )  # fmt: skip
    repeats = options.repeats or scenario.repeats
    if repeats > 1:
        raise _refuse(
            "zerowindow sweep",
            _repeats_source(scenario, options),
            "each step of a sweep is one run (its bisection decides on it)",
        )
    if scenario.control:
        raise _refuse("zerowindow sweep", "control = true", "a sweep step has no control run")
    if scenario.gating.inconclusive == "rerun":
        raise _refuse(
            "zerowindow sweep",
            '[gating] inconclusive = "rerun"',
            'a sweep step is one run, with no repeats to add; use "warn" or "fail"',
        )
    if needs_baseline(scenario.gates):
        raise _refuse(
            "zerowindow sweep", "gates relative to 'baseline'",
            "a sweep gates each step on its own figures; use absolute bounds",
        )  # fmt: skip
    if not any(isinstance(g.arrival, RateArrivals) for g in scenario.groups):
        raise ScenarioError(
            'a sweep needs a group with arrival = { kind = "constant" | "poisson" | '
            '"gamma", rate_rps = ... } (an open-loop group with a rate) to vary'
        )


LOOPBACK_OR_ANY = ("127.0.0.1", "localhost", "*", "0.0.0.0")
"""Master addresses that mean the same inside a network namespace as on the host."""


def _check_workers(scenario: Scenario, options: RunOptions, *, series: bool) -> None:
    remote = f"--remote-workers {options.remote_workers}"
    if options.remote_workers and series:
        raise _refuse(
            remote, "a plan of several runs (repeats, control, proxies or a sweep)",
            "remote workers quit with their master after the first run; use --workers",
        )  # fmt: skip
    if not scenario.needs_topology() or not (options.workers or options.remote_workers):
        return
    shaped = "network profiles, [server_net] or [netem] isolate"
    if options.remote_workers:
        raise _refuse(
            remote, shaped, "each group's master runs inside the group's network namespace, "
            "which workers on other machines cannot reach; use --workers",
        )  # fmt: skip
    host = options.master_bind.rpartition(":")[0] or options.master_bind
    if host.strip("[]") not in LOOPBACK_OR_ANY:
        raise _refuse(
            f"--master-bind {options.master_bind}", shaped,
            "the masters run inside the groups' network namespaces and listen on their "
            "loopback; give 127.0.0.1 (the default) or leave --master-bind out",
        )  # fmt: skip


def _arms(scenario: Scenario) -> list[Arm]:
    if not scenario.proxies:
        return [Arm(name=scenario.proxy.kind, folder="", proxy=scenario.proxy)]
    return [_arm(p) for p in scenario.proxies]


def _arm(named: NamedProxyConfig) -> Arm:
    return Arm(name=named.name, folder=named.name, proxy=named.proxy)


def make_plan(
    scenario: Scenario, options: RunOptions | None = None, *, scenario_path: Path | None = None
) -> Plan:
    """The :class:`Plan` of ``scenario`` with ``options`` (module docstring). Raises
    :class:`~zwcore.ScenarioError` naming both sides of a pair of options that cannot run
    together, and why: ``--baseline`` with ``--no-baseline`` or with no relative gate,
    relative gates with ``proxies``, a sweep with ``proxies``, repeats, ``control``, the rerun
    policy, relative gates or no open-loop group, and remote workers with several runs
    (``--baseline`` with ``--no-baseline``: :class:`RunOptions` refuses them)."""
    options = options or RunOptions()
    _check_baseline(scenario, options)
    repeats = options.repeats or scenario.repeats
    reruns = scenario.gating.max_reruns if scenario.gating.inconclusive == "rerun" else 0
    kind: PlanKind
    if options.sweep is not None:
        _check_sweep(scenario, options)
        kind, repeats, reruns = "sweep", 1, 0
    elif scenario.proxies:
        kind = "comparison"
    elif repeats > 1 or scenario.control or reruns:
        kind = "repeats"
    else:
        kind = "run"
    _check_workers(scenario, options, series=kind != "run")
    return Plan(
        kind=kind,
        scenario=scenario,
        scenario_path=None if scenario_path is None else str(scenario_path),
        options=options,
        arms=_arms(scenario),
        repeats=repeats,
        control=scenario.control and kind != "sweep",
        max_reruns=reruns,
        confidence=scenario.gating.confidence,
        bootstrap_draws=scenario.gating.bootstrap_draws,
    )


def plan_of_one(scenario: Scenario, *, arm: str | None = None) -> Plan:
    """The plan of one run of ``scenario`` as it ran, whatever its ``repeats``, ``control``
    and ``proxies`` say (the run of a folder analysed again: one run of a larger plan is a
    plan of one too); ``arm`` names its configuration (default: the proxy's kind)."""
    return Plan(
        kind="run",
        scenario=scenario,
        arms=[Arm(name=arm or scenario.proxy.kind, folder="", proxy=scenario.proxy)],
        confidence=scenario.gating.confidence,
        bootstrap_draws=scenario.gating.bootstrap_draws,
    )
