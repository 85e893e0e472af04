"""The life cycle of what runs: a plan (``harness.scenario.Plan``) run as one run or as a series
of runs against one target (repeats, control runs, a proxy comparison, a sweep), signals, the
target and proxy, the network, the load processes (one Locust process per group, or a master
with workers), the live progress display, the incident suite, the conclusion of a run and of a
plan (analysis → gates → outputs), shared with ``zerowindow analyze``, and the one exit-code
policy."""

from harness.lifecycle._analyze_folder import reanalyze
from harness.lifecycle._conclude import conclude
from harness.lifecycle._distributed import (
    DistributedError,
    Distribution,
    check_listen_address,
    parse_address,
    run_worker,
)
from harness.lifecycle._exit import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SETUP,
    decide,
    exit_code,
)
from harness.lifecycle._gate_trials import GateTrials, run_gate_trials
from harness.lifecycle._inputs import url_target
from harness.lifecycle._plan_run import run, run_plan, run_scenario
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._results import ArmResult, PlanResult, RunResult
from harness.lifecycle._signals import RunInterrupted
from harness.lifecycle._suite import load_incidents, plan_suite, run_suite

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SETUP",
    "ArmResult",
    "DistributedError",
    "Distribution",
    "GateTrials",
    "PlanResult",
    "RunInterrupted",
    "RunProgress",
    "RunResult",
    "check_listen_address",
    "conclude",
    "decide",
    "exit_code",
    "load_incidents",
    "parse_address",
    "plan_suite",
    "reanalyze",
    "run",
    "run_gate_trials",
    "run_plan",
    "run_scenario",
    "run_suite",
    "run_worker",
    "url_target",
]
