"""The run's life cycle: signals, the target and proxy, the network, the load processes (one
Locust process per group, or a master with workers), the live progress display, proxy
comparisons and sweeps (series of runs against one target), the incident suite, and the
conclusion (analysis → gates → outputs) shared with ``zerowindow analyze``."""

from harness.lifecycle._comparison_run import ComparisonResult, run_comparison
from harness.lifecycle._conclude import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SETUP,
    RunResult,
    conclude,
    exit_code,
    reanalyze,
)
from harness.lifecycle._distributed import (
    DistributedError,
    Distribution,
    check_listen_address,
    parse_address,
    run_worker,
)
from harness.lifecycle._gate_trials import GateTrials, run_gate_trials
from harness.lifecycle._inputs import url_target
from harness.lifecycle._progress import RunProgress
from harness.lifecycle._repeats import RepeatsResult, run_repeats
from harness.lifecycle._run import run_scenario
from harness.lifecycle._signals import RunInterrupted
from harness.lifecycle._suite import load_incidents, run_suite
from harness.lifecycle._sweep import SweepPoint, SweepResult, run_sweep

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SETUP",
    "ComparisonResult",
    "DistributedError",
    "Distribution",
    "GateTrials",
    "RunInterrupted",
    "RunProgress",
    "RepeatsResult",
    "RunResult",
    "SweepPoint",
    "SweepResult",
    "conclude",
    "exit_code",
    "load_incidents",
    "check_listen_address",
    "parse_address",
    "reanalyze",
    "run_comparison",
    "run_gate_trials",
    "run_repeats",
    "run_scenario",
    "run_suite",
    "run_sweep",
    "run_worker",
    "url_target",
]
