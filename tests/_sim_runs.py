"""Two short real runs of the positive-control scenario on the engine emulator, shared by the
report and compare tests: ``on_delivery`` (KV held by stalled readers) and ``on_finish``."""

from __future__ import annotations

import pytest

from harness._run import RunResult, run_scenario
from harness._scenario import Scenario, load_scenario
from tests.conftest import REPO

_cache: dict[str, RunResult] = {}


def _reduced(kv_release: str) -> Scenario:
    """sim-coupled with the stalled readers holding 8 s instead of 20 s."""
    base = load_scenario(REPO / "scenarios" / "sim-coupled.toml")
    engine = base.target.engine.model_copy(update={"kv_release": kv_release})  # type: ignore[union-attr]
    groups = []
    for g in base.groups:
        if g.action is not None:
            g = g.model_copy(update={"action": g.action.model_copy(update={"hold_s": 8})})
        groups.append(g)
    target = base.target.model_copy(update={"engine": engine})
    return base.model_copy(update={"target": target, "groups": groups})


def sim_runs(factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    """The two runs, made once per test session (about 30 s together)."""
    if not _cache:
        out = factory.mktemp("sim-report-runs")
        for release in ("on_delivery", "on_finish"):
            _cache[release] = run_scenario(_reduced(release), out_root=out)
    return _cache
