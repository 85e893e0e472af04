"""The issue's check on the tiny vLLM: scenarios/shaped-links.toml, fast readers on their own
unshaped link and slow readers behind 3G with a 4 KiB receive buffer.

vLLM is started by the run inside the server's network namespace (the session's shared vLLM
server lives in the host namespace, where the groups' namespaces cannot reach it), so this
test starts its own (about a minute). Needs CAP_NET_ADMIN.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from harness.lifecycle._run import run_scenario
from harness.scenario import load_scenario
from netem import has_net_admin
from tests.conftest import REPO, vllm_available

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(not has_net_admin(), reason="needs the CAP_NET_ADMIN capability"),
    pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed"),
]


def test_shaped_links_on_vllm(tiny_model: Path, tmp_path: Path):
    scenario = load_scenario(REPO / "scenarios" / "shaped-links.toml")
    target = scenario.target.model_copy(update={"model": str(tiny_model)})
    result = run_scenario(scenario.model_copy(update={"target": target}), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    net = json.loads((result.run_dir / "run.json").read_text())["network"]
    assert net["shaping"]["slow"]["backend"] in ("netem", "fallback")
    measured = net["measured"]["slow"]["measured"]
    assert measured["rtt_ms"] == pytest.approx(300, rel=0.15)
    requests = pd.read_parquet(result.run_dir / "requests.parquet")
    assert set(requests["outcome"]) == {"complete"}
    rwnd = requests.groupby("group")["server_rwnd_limited_ms"]
    # Slow readers: their window was full for much of their ~45 s stream (16.7 to 41.8 s
    # measured; less when their own load process is starved); fast ones: at most moments (a
    # starved load process reads late now and then).
    assert rwnd.min()["slow"] > 10_000
    assert rwnd.median()["fast"] < 1_000
    assert rwnd.min()["slow"] > 10 * rwnd.median()["fast"]
