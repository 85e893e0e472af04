"""Open-loop groups in real runs on the engine emulator: the requests go out on the schedule
(Kolmogorov-Smirnov against the requested Poisson rate, on the gaps actually sent), the
seed's schedule is the one sent, the summary reports send lag and latencies from the
scheduled send, and with two Locust workers the schedule is split with no request lost or
sent twice."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from harness.lifecycle import run_scenario
from harness.scenario import Scenario
from loadgen import ARRIVALS, prompt_seed

RATE_RPS = 20.0


def _scenario(arrival: dict, *, name: str = "open-loop", **lengths: object) -> Scenario:
    return Scenario.model_validate(
        {
            "name": name,
            "seed": 3,
            "max_duration_s": 60,
            "cooldown_s": 0.5,
            "target": {
                "kind": "sim",
                "engine": {"step_fixed_ms": 2.0, "decode_ms_per_seq": 0.05, "num_blocks": 1024,
                           "max_num_seqs": 64},
            },  # fmt: skip
            "groups": [
                {"name": "arrivals", "arrival": arrival, "prompt_tokens": 8, "max_tokens": 8,
                 **lengths}
            ],  # fmt: skip
        }
    )


def _sent(result) -> pd.DataFrame:
    requests = pd.read_parquet(result.run_dir / "requests.parquet")
    return requests[requests["group"] == "arrivals"].sort_values("schedule_index")


LENGTHS = {
    "prompt_tokens": {"kind": "uniform", "min": 4, "max": 32},
    "max_tokens": {"kind": "lognormal", "mean": 16, "stdev": 8, "max": 64},
}


@pytest.fixture(scope="module")
def poisson_run(tmp_path_factory: pytest.TempPathFactory):
    arrival = {"kind": "poisson", "rate_rps": RATE_RPS, "duration_s": 10}
    return run_scenario(
        _scenario(arrival, **LENGTHS), out_root=tmp_path_factory.mktemp("open-loop")
    )


def test_the_gaps_sent_pass_a_ks_test_against_the_requested_rate(poisson_run):
    assert poisson_run.exit_code == 0, poisson_run.summary.failure
    sent = _sent(poisson_run)
    assert len(sent) > 100 and set(sent["outcome"]) == {"complete"}
    gaps = np.diff(np.sort(sent["t_send"].to_numpy()))
    assert stats.kstest(gaps, "expon", args=(0, 1 / RATE_RPS)).pvalue > 0.01


def test_the_seeds_schedule_is_the_one_sent(poisson_run):
    sent = _sent(poisson_run)
    scenario = _scenario({"kind": "poisson", "rate_rps": RATE_RPS, "duration_s": 10}, **LENGTHS)
    offsets = ARRIVALS.parse(scenario.groups[0].arrival).schedule(
        prompt_seed(scenario.seed, "arrivals", "arrivals")
    )
    assert list(sent["schedule_index"]) == list(range(len(offsets)))
    scheduled = sent["t_scheduled"].to_numpy()
    assert np.allclose(scheduled - scheduled[0], offsets, atol=1e-6)
    lag_ms = sent["send_lag_ms"]
    assert (lag_ms >= 0).all() and lag_ms.median() < 50  # generous: a shared 2-core machine
    [group] = poisson_run.summary.groups
    assert group.send_lag_p99_ms is not None and group.send_lag_p99_ms >= group.send_lag_p50_ms
    assert group.sent_rps == pytest.approx(RATE_RPS, rel=0.3)
    assert group.ttft_from_scheduled_p50_ms is not None and group.ttft_p50_ms is not None
    assert group.ttft_from_scheduled_p50_ms >= group.ttft_p50_ms


def test_a_concurrency_ceiling_makes_late_requests_wait(tmp_path):
    # 40 requests at once, 4 at a time, each ~0.1 s: most of them wait for a slot.
    arrival = {"kind": "constant", "rate_rps": 1000, "requests": 40, "max_concurrency": 4}
    scenario = _scenario(arrival, name="ceiling")
    engine = scenario.target.engine.model_copy(update={"step_fixed_ms": 10.0})  # type: ignore[union-attr]
    scenario = scenario.model_copy(
        update={"target": scenario.target.model_copy(update={"engine": engine})}
    )
    result = run_scenario(scenario, out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    sent = _sent(result)
    assert len(sent) == 40
    assert sent["send_lag_ms"].max() > 500  # the last ones waited for nine rounds
    [group] = result.summary.groups
    assert group.ttft_from_scheduled_p99_ms > 5 * group.ttft_p99_ms


def test_two_workers_split_the_schedule_without_loss_or_duplicate(tmp_path):
    arrival = {"kind": "poisson", "rate_rps": 40, "requests": 60}
    result = run_scenario(
        _scenario(arrival, name="split"), out_root=tmp_path, workers=2
    )
    assert result.exit_code == 0, result.summary.failure
    sent = _sent(result)
    assert sorted(sent["schedule_index"]) == list(range(60))
    records = {p.name: len(p.read_text().splitlines()) for p in result.run_dir.glob("records-*")}
    assert sorted(records) == ["records-arrivals@w1.jsonl", "records-arrivals@w2.jsonl"]
    assert sorted(records.values()) == [30, 30]


def test_lengths_are_drawn_per_request_and_the_output_is_held_to_them(poisson_run):
    sent = _sent(poisson_run)
    prompts, outputs = sent["prompt_tokens_requested"], sent["max_tokens"]
    assert prompts.between(4, 32).all() and prompts.nunique() > 10
    assert outputs.between(1, 64).all() and outputs.nunique() > 10
    assert outputs.mean() == pytest.approx(16, rel=0.25)
    # ignore_eos (the default): the engine generates exactly what was asked.
    assert (sent["completion_tokens"] == outputs).all()


@pytest.fixture(scope="module")
def mix_run(tmp_path_factory: pytest.TempPathFactory):
    mix = [
        {"weight": 3, "read": {"kind": "full_speed"}},
        {"name": "stopper", "weight": 1,
         "action": {"kind": "stop_reading", "after_tokens": 2, "hold_s": 1}},
    ]  # fmt: skip
    arrival = {"kind": "constant", "rate_rps": 50, "requests": 200}
    scenario = _scenario(arrival, name="mix", mix=mix, max_tokens=64)
    scenario = Scenario.model_validate(  # a behaviour's figures are gate figures
        {**scenario.model_dump(mode="json"), "gates": ["arrivals.stopper.stalled >= 1"]}
    )
    return run_scenario(scenario, out_root=tmp_path_factory.mktemp("mix"))


def test_a_client_mix_draws_each_requests_behaviour_by_weight(mix_run):
    result = mix_run
    assert result.exit_code == 0, result.summary.failure
    sent = _sent(result)
    counts = sent["behaviour"].value_counts().to_dict()
    assert set(counts) == {"full_speed", "stopper"}
    assert counts["stopper"] == pytest.approx(50, abs=20)  # 1 in 4 of 200
    stoppers = sent[sent["behaviour"] == "stopper"]
    assert set(stoppers["action"]) == {"stop_reading"}
    assert set(sent[sent["behaviour"] == "full_speed"]["outcome"]) == {"complete"}
    groups = {g.group: g for g in result.summary.groups}
    assert groups["arrivals"].requests == 200
    assert groups["arrivals.stopper"].requests == counts["stopper"]
    assert groups["arrivals.stopper"].stalled == counts["stopper"]
    assert groups["arrivals.full_speed"].stalled == 0
    assert [g.passed for g in result.gates] == [True]


def test_a_mooncake_trace_replays_on_its_times(tmp_path):
    rng = np.random.default_rng(5)
    stamps_ms = np.cumsum(rng.exponential(50.0, 80)).round()  # ~20 requests/s for 4 s
    trace = tmp_path / "mooncake.jsonl"
    trace.write_text("".join(
        json.dumps({"timestamp": int(t), "input_length": int(rng.integers(8, 64)),
                    "output_length": int(rng.integers(1, 16)), "hash_ids": [0, i % 3]}) + "\n"
        for i, t in enumerate(stamps_ms)
    ))  # fmt: skip
    arrival = {"kind": "trace", "format": "mooncake", "path": str(trace), "block_tokens": 4}
    result = run_scenario(_scenario(arrival, name="mooncake"), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    sent = _sent(result)
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert len(sent) == 80 and set(sent["outcome"]) == {"complete"}
    offsets_s = (stamps_ms - stamps_ms[0]) / 1000.0
    scheduled = sent["t_scheduled"].to_numpy()
    assert np.allclose(scheduled - scheduled[0], offsets_s, atol=1e-6)
    # Sent on the trace's times (the send-lag target, 5 ms p99, is a benchmark's).
    assert np.percentile(sent["send_lag_ms"], 99) < 100
    assert list(sent["prompt_tokens_requested"]) == [r["input_length"] for r in rows]
    assert list(sent["completion_tokens"]) == [r["output_length"] for r in rows]


def test_a_run_replays_with_its_client_behaviours(mix_run, tmp_path):
    arrival = {"kind": "trace", "format": "zerowindow", "path": str(mix_run.run_dir)}
    result = run_scenario(_scenario(arrival, name="replay"), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    before, after = _sent(mix_run), _sent(result)
    assert len(after) == len(before)
    assert list(after["behaviour"]) == list(before["behaviour"])
    assert list(after["action"].fillna("-")) == list(before["action"].fillna("-"))
    assert list(after["max_tokens"]) == list(before["max_tokens"])
    gaps = np.diff(before["t_scheduled"].to_numpy()), np.diff(after["t_scheduled"].to_numpy())
    assert np.allclose(*gaps, atol=1e-6)
