"""The engine probe's prefix-cache figures on vLLM itself: the count of cached-free blocks kept
on vLLM's own ``BlockPool`` (in a process of its own: it imports vLLM), and a repeated prompt
prefix served from the cache of the shared real server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from harness.lifecycle import run_scenario
from harness.scenario import parse_scenario
from tests.conftest import REPO, vllm_available

pytestmark = pytest.mark.vllm


@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_the_cached_free_count_follows_vllms_block_pool() -> None:
    script = REPO / "tests" / "vllm_block_pool_check.py"
    done = subprocess.run(
        [sys.executable, str(script), "7", "1500"], capture_output=True, text=True, cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    operations, peak = map(int, done.stdout.split())
    assert operations == 1500 and peak > 0


def test_a_repeated_prompt_prefix_is_served_from_vllms_prefix_cache(
    vllm_server: str, vllm_engine_dir: Path, tmp_path: Path
) -> None:
    text = f"""
name = "prefix"
cooldown_s = 0.5
[target]
kind = "url"
url = "{vllm_server}"
served_model_name = "tiny"
engine_dir = "{vllm_engine_dir}"
[[groups]]
name = "shared"
max_tokens = 4
arrival = {{ kind = "planned", requests = [
  {{ offset_s = 0.0, prompt_tokens = 300, prefix_blocks = [31, 32], block_tokens = 128 }},
  {{ offset_s = 0.5, prompt_tokens = 300, prefix_blocks = [31, 32], block_tokens = 128 }},
] }}
"""
    result = run_scenario(parse_scenario(text, path=Path("p.toml")), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    requests = pd.read_parquet(result.run_dir / "requests.parquet").sort_values("t_send")
    cached = requests["prompt_cached_tokens"].tolist()
    # The second shares 256 words with the first: vLLM serves whole blocks of 32 tokens of it.
    assert cached[1] >= 64 and cached[1] % 32 == 0, requests[["prompt_cached_tokens"]]
    assert (requests["engine_prompt_tokens"] > cached[1]).all()
    steps = pd.read_parquet(result.run_dir / "engine_steps.parquet")
    assert steps["kv_blocks_in_use"].notna().all() and steps["kv_blocks_cached_free"].notna().all()
    # vLLM's usage counts blocks in use only, of 63 (64 less its null block)
    assert (steps["kv_blocks_in_use"] == (steps["kv_cache_usage"] * 63).round()).all()
    assert steps["kv_blocks_cached_free"].max() >= cached[1] // 32
    summary = json.loads((result.run_dir / "summary.json").read_text())
    assert summary["groups"][0]["prefix_hit_ratio"] > 0
    assert summary["server"]["kv_blocks_cached_free_peak"] >= cached[1] // 32
