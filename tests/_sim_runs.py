"""Two short real runs of the positive-control scenario on the engine emulator, shared by the
report and compare tests: ``on_delivery`` (KV held by stalled readers) and ``on_finish``."""

from __future__ import annotations

import pytest

from harness.lifecycle import RunResult, run_scenario
from harness.scenario import Scenario, load_scenario, parse_gate
from loadgen import AbortiveClose, Paced
from tests.conftest import REPO

_cache: dict[str, RunResult] = {}


def reduced(kv_release: str) -> Scenario:
    """sim-coupled with the stalled readers holding 6 s instead of 20 s, and a 0.5 s cool-down
    (the clients are gone by then: nothing is left to observe)."""
    base = load_scenario(REPO / "scenarios" / "sim-coupled.toml")
    engine = base.target.engine.model_copy(update={"kv_release": kv_release})  # type: ignore[union-attr]
    groups = []
    for g in base.groups:
        if g.action is not None:
            g = g.model_copy(update={"action": g.action.model_copy(update={"hold_s": 6})})
        groups.append(g)
    target = base.target.model_copy(update={"engine": engine})
    return base.model_copy(update={"target": target, "groups": groups, "cooldown_s": 0.5})


def sim_runs(factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    """The two runs, made once per test session (about 30 s together)."""
    if not _cache:
        out = factory.mktemp("sim-report-runs")
        for release in ("on_delivery", "on_finish"):
            _cache[release] = run_scenario(reduced(release), out_root=out)
    return _cache


def rst_run(factory: pytest.TempPathFactory) -> RunResult:
    """A short run on the engine emulator whose ``rst`` group (2 users) closes with RST after
    4 tokens and whose ``fast`` group (2 users) reads to the end (a few seconds). Of its two
    gates the second (TTFT p50 under 1 µs) fails, so the run exits 1."""
    if "rst" not in _cache:
        base = reduced("on_finish")
        fast = base.groups[0].model_copy(
            update={"users": 2, "requests_per_user": 1, "start_after_s": 0}
        )
        # Paced reads: a full-speed reader on a busy machine may get the whole stream and
        # [DONE] in one read, and then the action never fires.
        rst = fast.model_copy(
            update={
                "name": "rst",
                "read": Paced(bytes_per_read=512, interval_s=0.05),
                "action": AbortiveClose(after_tokens=4),
                "start_after_s": 3,
            }
        )
        gates = [parse_gate("fast.outcome.complete == 2"), parse_gate("rst.ttft_p50_ms <= 0.001")]
        scenario = base.model_copy(
            update={
                "name": "sim-rst",
                "description": "2 fast readers, 2 readers that send RST after 4 tokens",
                "groups": [fast, rst],
                "gates": gates,
            }
        )
        _cache["rst"] = run_scenario(scenario, out_root=factory.mktemp("sim-rst-run"))
    return _cache["rst"]
