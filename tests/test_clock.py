"""One clock for every load process: a worker's offset estimated from its master's pings, and
its records moved onto the harness's clock (``loadgen._clock``). The worker in a time
namespace of its own is test_distributed's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen import Chunk, RequestRecord, clock_estimates, to_harness_clock, workers_log
from loadgen._clock import estimate, ping, pong, sample


def test_a_sample_is_exact_within_half_its_round_trip() -> None:
    # The worker is 100 s ahead; the ping takes 1 ms out and 3 ms back.
    t0 = 50.0
    answer = pong(ping(0, t0), tw=t0 + 0.001 + 100.0)
    measured = sample(answer, t1=t0 + 0.004)
    assert measured["rtt_s"] == pytest.approx(0.004)
    assert abs(measured["offset_s"] - 100.0) <= measured["rtt_s"] / 2 + 1e-12
    with pytest.raises(KeyError):
        sample({"burst": 0, "t0": 1.0}, t1=2.0)


def test_the_shortest_round_trip_wins_and_drift_widens_the_bound() -> None:
    samples = [
        {"burst": 0, "offset_s": 10.003, "rtt_s": 0.010},
        {"burst": 0, "offset_s": 10.000, "rtt_s": 0.002},  # the best
        {"burst": 1, "offset_s": 10.004, "rtt_s": 0.002},  # 4 ms of drift by then
    ]
    found = estimate(samples)
    assert found is not None
    assert found.offset_s == 10.000 and found.rtt_min_s == 0.002
    assert found.samples == 3 and found.bursts == 2
    assert found.bound_s == pytest.approx(0.004 + 0.001)  # every burst's best agrees within it
    assert estimate([]) is None


def test_estimates_are_read_from_the_masters_log(tmp_path: Path) -> None:
    lines = [
        {"t": 1, "event": "hello", "client_id": "a", "worker": "r1"},
        {"t": 1, "event": "clock", "client_id": "a", "worker": "r1", "burst": 0,
         "offset_s": 5.0, "rtt_s": 0.001},
        {"t": 1, "event": "clock", "client_id": "b", "worker": "r2", "burst": 0,
         "offset_s": -2.0, "rtt_s": 0.004},
        {"t": 1, "event": "clock", "client_id": "b", "worker": "r2"},  # malformed: skipped
    ]  # fmt: skip
    text = "".join(json.dumps(x) + "\n" for x in lines) + '{"t": 2, "event": "clo'
    workers_log(tmp_path, "g").write_text(text)
    found = clock_estimates(tmp_path, "g")
    assert sorted(found) == ["r1", "r2"]
    assert found["r1"].offset_s == 5.0 and found["r1"].bound_s == pytest.approx(0.0005)
    assert found["r2"].as_dict() == {
        "offset_s": -2.0, "bound_ms": 2.0, "rtt_min_ms": 4.0, "samples": 1, "bursts": 1,
    }  # fmt: skip
    assert clock_estimates(tmp_path, "other") == {}


def test_every_monotonic_time_of_a_record_moves() -> None:
    record = RequestRecord(
        request_id="x", user_class="U", group="g", network_profile="none",
        endpoint="completions", max_tokens=4, prompt_tokens_requested=8,
        t_send=1000.0, t_send_wall=1.7e9, t_first_byte=1000.1, t_first_token=1000.2,
        t_last_byte=1000.3, t_end=1000.4, t_action=1000.25, t_cut_seen=None,
        t_scheduled=999.9, chunks=[Chunk(1000.2, 1, 10, "a")], stalls=[[1000.21, None]],
    )  # fmt: skip
    found = estimate([{"burst": 0, "offset_s": 1000.0, "rtt_s": 0.002}])
    assert found is not None
    moved = to_harness_clock(record, found)
    assert (moved.t_send, moved.t_first_token, moved.t_end) == pytest.approx((0.0, 0.2, 0.4))
    assert (moved.t_first_byte, moved.t_last_byte) == pytest.approx((0.1, 0.3))
    assert (moved.t_action, moved.t_scheduled) == pytest.approx((0.25, -0.1))
    assert moved.t_cut_seen is None and moved.t_send_wall == 1.7e9
    assert moved.chunks[0].t == pytest.approx(0.2) and moved.chunks[0].text == "a"
    assert moved.stalls[0][0] == pytest.approx(0.21) and moved.stalls[0][1] is None
    assert moved.clock_bound_ms == pytest.approx(1.0)
    assert moved.ttft_ms == pytest.approx(record.ttft_ms)
