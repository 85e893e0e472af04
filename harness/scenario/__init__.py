"""Scenarios: what an experiment runs (target, proxy, user groups, network, gates), read from
TOML and validated, every problem located at its file, line and field."""

from harness.scenario._gate_syntax import (
    OPS,
    Gate,
    GateSyntaxError,
    needs_baseline,
    parse_gate,
    unknown_figures,
)
from harness.scenario._load import load_scenario, parse_scenario
from harness.scenario._matrix import MATRIX_PHASES, VICTIMS, MatrixConfig
from harness.scenario._models import (
    CollectorConfig,
    GatingConfig,
    HistoryConfig,
    IncidentConfig,
    NamedProxyConfig,
    NetemConfig,
    Scenario,
    ServerNetConfig,
    TracesConfig,
    VerdictConfig,
)
from harness.scenario._placement import PlacementConfig
from harness.scenario._plan import (
    GOODPUT_KEYS,
    MASTER_BIND,
    Arm,
    Plan,
    PlanKind,
    RunEntry,
    RunOptions,
    SweepSettings,
    make_plan,
    plan_of_one,
)
from harness.scenario._reference import scenario_json_schema, scenario_reference
from zwcore import ScenarioError

__all__ = [
    "plan_of_one",
    "make_plan",
    "SweepSettings",
    "MASTER_BIND",
    "RunOptions",
    "RunEntry",
    "PlanKind",
    "Plan",
    "Arm",
    "GOODPUT_KEYS",
    "MATRIX_PHASES",
    "OPS",
    "VICTIMS",
    "CollectorConfig",
    "Gate",
    "GateSyntaxError",
    "GatingConfig",
    "HistoryConfig",
    "TracesConfig",
    "IncidentConfig",
    "MatrixConfig",
    "NamedProxyConfig",
    "NetemConfig",
    "PlacementConfig",
    "Scenario",
    "ScenarioError",
    "ServerNetConfig",
    "VerdictConfig",
    "load_scenario",
    "needs_baseline",
    "parse_gate",
    "parse_scenario",
    "scenario_json_schema",
    "scenario_reference",
    "unknown_figures",
]
