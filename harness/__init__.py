"""What the experiment does: scenarios, servers, collectors, runs, analysis, gates and outputs.

The public names, by the path the data takes::

    load_scenario ──► make_plan ──► run_plan (run) ──► run folders ──► analyze ──► gates
                                                                              └──► reports

Each role is a subpackage with its own ``__all__`` (``harness.scenario``, ``harness.servers``,
``harness.collectors``, ``harness.lifecycle``, ``harness.runfolder``, ``harness.analysis``,
``harness.gates``, ``harness.outputs``); the names most users need are re-exported here.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.analysis import Analysis, RunFacts, analyze, read_facts
    from harness.gates import Baseline, BaselineError, GateResult, load_baseline, save_baseline
    from harness.lifecycle import (
        EXIT_FAILED,
        EXIT_INTERRUPTED,
        EXIT_OK,
        EXIT_SETUP,
        ArmResult,
        Distribution,
        PlanResult,
        RunResult,
        reanalyze,
        run,
        run_plan,
        run_scenario,
    )
    from harness.outputs import write_report
    from harness.runfolder import RunSummary, figure_names, figures
    from harness.scenario import (
        Plan,
        RunOptions,
        Scenario,
        load_scenario,
        make_plan,
        parse_scenario,
    )
    from harness.servers import PROXIES, TARGETS, ProxyConfigBase, TargetConfigBase
    from zwcore import (
        LoadError,
        NetworkError,
        ProxyError,
        RunFolderError,
        ScenarioError,
        TargetError,
        ZerowindowError,
    )

# Loaded on first use, so that ``python -m harness._sim`` and ``python -m harness._egress`` (the
# self-contained servers) start without importing the whole harness.
_LAZY = {
    "Analysis": "harness.analysis",
    "Baseline": "harness.gates",
    "BaselineError": "harness.gates",
    "ArmResult": "harness.lifecycle",
    "Distribution": "harness.lifecycle",
    "Plan": "harness.scenario",
    "PlanResult": "harness.lifecycle",
    "RunOptions": "harness.scenario",
    "EXIT_FAILED": "harness.lifecycle",
    "EXIT_INTERRUPTED": "harness.lifecycle",
    "EXIT_OK": "harness.lifecycle",
    "EXIT_SETUP": "harness.lifecycle",
    "GateResult": "harness.gates",
    "LoadError": "zwcore",
    "NetworkError": "zwcore",
    "PROXIES": "harness.servers",
    "ProxyConfigBase": "harness.servers",
    "ProxyError": "zwcore",
    "RunFacts": "harness.analysis",
    "RunFolderError": "zwcore",
    "RunResult": "harness.lifecycle",
    "RunSummary": "harness.runfolder",
    "Scenario": "harness.scenario",
    "ScenarioError": "zwcore",
    "TARGETS": "harness.servers",
    "TargetConfigBase": "harness.servers",
    "TargetError": "zwcore",
    "ZerowindowError": "zwcore",
    "analyze": "harness.analysis",
    "figure_names": "harness.runfolder",
    "figures": "harness.runfolder",
    "load_baseline": "harness.gates",
    "load_scenario": "harness.scenario",
    "parse_scenario": "harness.scenario",
    "read_facts": "harness.analysis",
    "reanalyze": "harness.lifecycle",
    "make_plan": "harness.scenario",
    "run": "harness.lifecycle",
    "run_plan": "harness.lifecycle",
    "run_scenario": "harness.lifecycle",
    "save_baseline": "harness.gates",
    "write_report": "harness.outputs",
}

__all__ = [
    "EXIT_FAILED",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_SETUP",
    "PROXIES",
    "TARGETS",
    "Analysis",
    "Baseline",
    "BaselineError",
    "ArmResult",
    "Distribution",
    "Plan",
    "PlanResult",
    "RunOptions",
    "GateResult",
    "LoadError",
    "NetworkError",
    "ProxyConfigBase",
    "ProxyError",
    "RunFacts",
    "RunFolderError",
    "RunResult",
    "RunSummary",
    "Scenario",
    "ScenarioError",
    "TargetConfigBase",
    "TargetError",
    "ZerowindowError",
    "analyze",
    "figure_names",
    "figures",
    "load_baseline",
    "load_scenario",
    "parse_scenario",
    "read_facts",
    "reanalyze",
    "make_plan",
    "run",
    "run_plan",
    "run_scenario",
    "save_baseline",
    "write_report",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
