"""The emulator's prefix cache (``enable_prefix_caching``, vLLM v1's automatic prefix caching):
a request that shares full blocks of its prompt with an earlier one starts from them, computes
only the rest, and says so in the engine tables, ``/metrics`` and a run's figures."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from harness._engine_probe import REQUESTS_FILE, STEPS_FILE
from harness._sim import SimConfig, SimServer
from harness._sim._protocol import parse_request
from harness._sim._scheduler import Scheduler, SimRequest
from harness.lifecycle import run_scenario
from harness.scenario import parse_scenario
from tests.test_sim_helpers import CLIENT, fast_sim_config, scrape

SHARED = tuple(f"w{i}" for i in range(70))  # 4 full blocks of 16 and 6 tokens more


def _request(rid: str, tail: str) -> SimRequest:
    tokens = (*SHARED, *(f"{tail}{i}" for i in range(30)))
    return SimRequest(rid, prompt_len=len(tokens), max_tokens=4, ignore_eos=True,
                      prompt_tokens=tokens)  # fmt: skip


def _drain(sched: Scheduler, now: float = 0.0) -> list[int]:
    """Run every step to the end; the prefill tokens each step computed."""
    prefill = []
    while (step := sched.schedule(now)) is not None:
        prefill.append(step.num_prefill_tokens)
        now += 1.0
        sched.complete(step, now)
    return prefill


@pytest.mark.parametrize("together", [False, True])
def test_a_shared_prompt_prefix_is_served_from_the_cache(together: bool) -> None:
    cfg = SimConfig(block_size=16, num_blocks=32, max_model_len=256)
    sched = Scheduler(cfg)
    a, b = _request("a", "x"), _request("b", "y")
    sched.add_request(a)
    if not together:  # a has finished and freed its blocks: they wait, cached, for reuse
        _drain(sched)
        assert sched.blocks.num_cached_free_blocks == 100 // 16  # its full blocks
        assert sched.blocks.num_used_blocks == 0
    sched.add_request(b)
    prefill = _drain(sched)
    assert a.prompt_cached_tokens == 0
    assert b.prompt_cached_tokens == 64  # the 4 shared full blocks, not the 6 tokens after
    assert (prefill[0] if not together else prefill[0] - 100) == 100 - 64
    assert sched.blocks.num_used_blocks == 0 and sched.blocks.num_cached_free_blocks > 0


def test_without_prefix_caching_nothing_is_cached() -> None:
    sched = Scheduler(SimConfig(block_size=16, num_blocks=32, max_model_len=256,
                                enable_prefix_caching=False))  # fmt: skip
    for rid in ("a", "b"):
        request = _request(rid, rid)
        sched.add_request(request)
        assert _drain(sched)[0] == 100
        assert request.prompt_cached_tokens == 0
    assert sched.blocks.num_cached_free_blocks == 0


def test_a_chat_prompt_is_its_rendered_messages() -> None:
    cfg = SimConfig()
    body = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "hi"}]}  # fmt: skip
    params = parse_request(body, cfg, chat=True)
    assert params.prompt_tokens == (
        "<|start|>", "system", "<|sep|>", "Be", "brief", ".", "<|end|>",
        "<|start|>", "user", "<|sep|>", "hi", "<|end|>", "<|start|>", "assistant", "<|sep|>",
    )  # fmt: skip
    assert params.prompt_len == len(params.prompt_tokens) == 3 + (4 + 3) + (4 + 1)


def test_the_tables_and_metrics_count_hits_and_cached_free_blocks(tmp_path: Path) -> None:
    body = {"prompt": " ".join(["alpha beta gamma delta"] * 40), "max_tokens": 4,
            "ignore_eos": True}  # fmt: skip
    with SimServer(fast_sim_config("on_finish"), engine_dir=tmp_path) as server:
        for _ in range(2):
            assert CLIENT.post(server.url + "/v1/completions", json=body).status_code == 200
        metrics = scrape(server.url)
    requests = pq.read_table(tmp_path / REQUESTS_FILE).to_pylist()
    steps = pq.read_table(tmp_path / STEPS_FILE).to_pylist()
    assert [r["prompt_cached_tokens"] for r in requests] == [0, 128]  # 160 tokens, blocks of 32
    assert [r["prompt_tokens"] for r in requests] == [160, 160]
    assert metrics["vllm:prefix_cache_queries_total"] == 320
    assert metrics["vllm:prefix_cache_hits_total"] == 128
    last = steps[-1]
    assert last["kv_blocks_in_use"] == 0 and last["kv_cache_usage"] == 0  # cached-free is free
    assert last["kv_blocks_cached_free"] == 5  # 164 slots: 5 full blocks hashed
    assert max(s["kv_blocks_in_use"] for s in steps) == 6


RUN = """
name = "prefix"
cooldown_s = 0.3
gates = ["shared.prefix_hit_ratio > 0.4", "server.kv_blocks_cached_free_peak >= 8"]
[target]
kind = "sim"
[target.engine]
step_fixed_ms = 1.0
[[groups]]
name = "shared"
max_tokens = 8
arrival = { kind = "planned", requests = [
  { offset_s = 0.0, prompt_tokens = 300, prefix_blocks = [7], block_tokens = 256 },
  { offset_s = 0.3, prompt_tokens = 300, prefix_blocks = [7], block_tokens = 256 },
] }
"""


def test_a_run_reports_the_groups_prefix_hits(tmp_path: Path) -> None:
    result = run_scenario(parse_scenario(RUN, path=Path("p.toml")), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure  # the gates on both figures passed
    requests = pd.read_parquet(result.run_dir / "requests.parquet").sort_values("t_send")
    # 256 shared words are 8 full blocks of 32 emulated tokens
    assert requests["prompt_cached_tokens"].tolist() == [0, 256]
    assert requests["engine_prompt_tokens"].tolist() == [300, 300]
    summary = json.loads((result.run_dir / "summary.json").read_text())
    group = summary["groups"][0]
    assert group["prompt_cached_tokens"] == 256
    assert group["prefix_hit_ratio"] == pytest.approx(256 / 600)
    assert summary["server"]["kv_blocks_cached_free_peak"] >= 8
