"""The positive control end to end: the same scenario on the engine emulator, differing only
in ``kv_release``, gives "held" and "none held"; the held KV delays the fast readers."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness.lifecycle import RunResult, run_scenario
from harness.servers import EgressProxyConfig, NginxProxyConfig
from tests._sim_runs import reduced, sim_runs


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    """sim-coupled with 6 s holds (tests._sim_runs, shared with the report and compare
    tests): coupled and not; then the fast readers alone, and the coupled engine behind the
    egress buffer and behind buffering nginx."""
    shared = sim_runs(tmp_path_factory)
    runs = {k: shared[k] for k in ("on_delivery", "on_finish")}
    base = reduced("on_delivery")
    out = tmp_path_factory.mktemp("sim-runs")
    fast_only = base.model_copy(update={"groups": [g for g in base.groups if g.name == "fast"]})
    runs["fast_only"] = run_scenario(fast_only, out_root=out)
    egress = EgressProxyConfig(kind="egress", stall_timeout_s=2.5)
    runs["egress"] = run_scenario(base.model_copy(update={"proxy": egress}), out_root=out)
    if shutil.which("nginx"):
        proxy = NginxProxyConfig(kind="nginx", buffering=True)
        scenario = base.model_copy(update={"proxy": proxy})
        runs["nginx_buffered"] = run_scenario(scenario, out_root=out)
    return runs


needs_nginx = pytest.mark.skipif(
    shutil.which("nginx") is None, reason="nginx is not installed (apt-get install nginx)"
)


def _verdict(result: RunResult) -> dict:
    return result.summary.verdicts["kv_held_by_undelivered_streams"]


def _group(result: RunResult, name: str):
    return next(g for g in result.summary.groups if g.group == name)


def test_runs_complete(runs):
    for name, result in runs.items():
        assert result.exit_code == 0, (name, result.summary.failure)
        requests = pd.read_parquet(result.run_dir / "requests.parquet")
        assert (requests[requests["group"] == "fast"]["outcome"] == "complete").all()
        sampled = {p.group for p in result.summary.client_saturation.processes}
        assert sampled == {g.group for g in result.summary.groups}, name


def test_on_delivery_is_reported_held(runs):
    verdict = _verdict(runs["on_delivery"])
    assert verdict["status"] == "held", verdict
    assert verdict["kv_held_s"] >= 3 and verdict["kv_seconds"] > 1  # of a 6 s hold
    assert verdict["undelivered_peak_bytes"] > 0
    assert "HELD" in verdict["line"]
    # From the engine's own records, through the same analysis as vLLM's, and the scrapes
    # agree: the stalled streams' KV outlived their generation.
    assert verdict["source"] == "engine_probe" and verdict["agreement"] == "agree", verdict
    assert verdict["requests_held"] >= 1 and verdict["engine_requests_unjoined"] == 0
    requests = pd.read_parquet(runs["on_delivery"].run_dir / "requests.parquet")
    assert requests["engine_request_id"].notna().all()
    held = requests[requests["kv_held_after_generation_ms"] > 1000]
    assert len(held) and (held["outcome"] != "complete").all()  # the stalled ones
    # In bytes: 64 blocks of 32 tokens of 1,024 bytes each (the emulator's default KV bytes per
    # token, the tiny model's); the held peak is its share of that pool, in the line too.
    run_dir = runs["on_delivery"].run_dir
    assert json.loads((run_dir / "run.json").read_text())["engine_probe"]["kv_block_bytes"] == (
        32 * 1024
    )
    figures = runs["on_delivery"].figures
    assert figures["kv_cache_bytes"] == verdict["kv_cache_bytes"] == 64 * 32 * 1024
    held_bytes = verdict["kv_cache_bytes"] * verdict["kv_held_peak_perc"] / 100
    assert figures["kv_held_peak_bytes"] == verdict["kv_held_peak_bytes"] == round(held_bytes)
    assert f"= {held_bytes / 2**20:.1f} MiB" in verdict["line"]


def test_a_machine_without_a_gpu_says_so_and_records_nothing_for_it(runs):
    result = runs["on_finish"]
    accelerator = json.loads((result.run_dir / "run.json").read_text())["accelerator"]
    if accelerator["present"]:
        pytest.skip(f"this machine has GPUs: {accelerator['gpus']}")
    assert accelerator["reason"]  # NVML's own words: no library, no driver, no device
    assert not (result.run_dir / "accelerator.parquet").exists()
    assert result.summary.accelerator is None
    assert result.figures["accelerator.memory_used_peak_bytes"] is None


def test_on_finish_is_reported_none_held(runs):
    verdict = _verdict(runs["on_finish"])
    assert verdict["status"] == "none", verdict
    assert verdict["window_s"] >= 2
    assert verdict["source"] == "engine_probe" and verdict["requests_held"] == 0
    assert verdict["kv_held_after_generation_max_ms"] < 100


def test_held_kv_delays_fast_readers_and_causes_preemptions(runs):
    held, alone = runs["on_delivery"], runs["fast_only"]
    assert held.summary.server.preemptions > alone.summary.server.preemptions
    # Fast requests queue for the few blocks the hostage KV leaves: their TTFT tail grows.
    assert _group(held, "fast").ttft_p99_ms > 5 * _group(alone, "fast").ttft_p99_ms


@needs_nginx
def test_nginx_buffering_frees_the_hostage_kv(runs):
    """The write-up's first remedy: a buffering proxy reads the whole response, so even an
    engine that releases KV only on delivery gets its blocks back at once."""
    buffered, held = runs["nginx_buffered"], runs["on_delivery"]
    assert buffered.exit_code == 0, buffered.summary.failure
    verdict = _verdict(buffered)
    assert verdict["status"] == "none", verdict
    assert buffered.summary.server.preemptions < held.summary.server.preemptions
    assert _group(buffered, "fast").ttft_p99_ms * 5 < _group(held, "fast").ttft_p99_ms
    assert (buffered.run_dir / "nginx" / "nginx.conf").read_text().count("proxy_buffering on")


def test_egress_buffer_frees_the_hostage_kv(runs):
    """The toolkit's own egress buffer reads each response into host memory at full speed, so
    the coupled engine releases KV and the fast readers are served as if alone."""
    egress, held = runs["egress"], runs["on_delivery"]
    assert egress.exit_code == 0, egress.summary.failure
    assert _verdict(egress)["status"] != "held", _verdict(egress)
    assert _group(egress, "fast").ttft_p99_ms * 5 < _group(held, "fast").ttft_p99_ms
    assert (egress.run_dir / "egress.log").exists()
