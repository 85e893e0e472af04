"""Shaped links on the tiny vLLM: scenarios/proxy-comparison-3g.toml's workload without a proxy,
fast readers on their own unshaped link and slow readers behind 3G with a 4 KiB receive buffer,
with two Locust workers per group. (The comparison itself, none vs nginx vs egress behind the
same shaped links with workers, runs on the emulator in test_comparison_netem; egress and nginx
on vLLM in test_proxy_vllm.)

vLLM is started by the run inside the server's network namespace (the session's shared vLLM
server lives in the host namespace, where the groups' namespaces cannot reach it), so this
test starts its own (about a minute). Needs CAP_NET_ADMIN.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.lifecycle import run
from harness.scenario import RunOptions, load_scenario
from netem import has_net_admin
from tests.conftest import REPO, vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_net_admin(), reason="needs the CAP_NET_ADMIN capability"),
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed"),
]


def test_3g_readers_with_workers_on_vllm_in_its_namespace(tiny_model: Path, tmp_path: Path):
    scenario = load_scenario(REPO / "scenarios" / "proxy-comparison-3g.toml")
    target = scenario.target.model_copy(update={"model": str(tiny_model)})
    # The slow readers' answers at 200 tokens (~60 KB) instead of 600: seconds on 3G still.
    shorter = [
        g.model_copy(update={"max_tokens": 200}) if g.name == "slow" else g
        for g in scenario.groups
    ]
    result = run(
        scenario.model_copy(update={"target": target, "proxies": [], "groups": shorter}),
        RunOptions(workers=2),
        out_root=tmp_path,
    )
    assert result.exit_code == 0, result.failure
    one = result.only_run()
    info = json.loads((one.run_dir / "run.json").read_text())
    network = info["network"]
    assert network["shaping"]["slow"]["backend"] in ("netem", "fallback")
    assert network["measured"]["slow"]["measured"]["rtt_ms"] == pytest.approx(300, rel=0.15)
    assert info["target"]["kind"] == "vllm" and info["versions"]["vllm"]
    assert all(len(p["workers"]) == 2 for p in info["load_processes"])
    groups = {g.group: g for g in one.summary.groups}
    assert groups["slow"].outcomes == {"complete": 4}
    assert groups["fast"].outcomes == {"complete": 8}
    assert groups["slow"].ttft_p50_ms is not None and groups["slow"].ttft_p50_ms > 500
    # vLLM's sockets that face the slow readers, in the server's namespace, were held back by
    # their 4 KiB window for seconds.
    slow_rwnd = groups["slow"].server_rwnd_limited_p50_ms or 0
    fast_rwnd = groups["fast"].server_rwnd_limited_p50_ms or 0
    assert slow_rwnd > 2_000 and fast_rwnd < 1_000, (slow_rwnd, fast_rwnd)
    verdict = one.summary.verdicts["kv_held_by_undelivered_streams"]
    assert verdict["status"] == "none", verdict["line"]  # vLLM frees on finish
    assert verdict["source"] == "engine_probe"  # the probe loaded inside the namespace too
