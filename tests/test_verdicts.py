"""The KV-held verdict on synthetic time series (the live cases run against vLLM and sim)."""

import pandas as pd
import pytest

from harness.analysis._verdicts import kv_held_verdict


def _metrics(kv, running):
    n = len(kv)
    return pd.DataFrame(
        {
            "t": [float(i) for i in range(n)],
            "scrape_ok": [True] * n,
            "kv_cache_usage": kv,
            "num_requests_running": running,
            "num_requests_waiting": [0] * n,
        }
    )


def _sockets(send_q):
    return pd.DataFrame({"t": [float(i) for i in range(len(send_q))], "send_q_bytes": send_q})


def test_held_when_kv_stays_up_after_generation_with_send_q():
    # generation ends at t=2 (running 0); KV stays at 50 % while 4 KB wait in Send-Q until t=5
    v = kv_held_verdict(
        _metrics([0.9, 0.8, 0.5, 0.5, 0.5, 0.0, 0.0], [3, 2, 0, 0, 0, 0, 0]),
        _sockets([0, 9000, 4000, 4000, 4000, 0, 0]),
        t_first_send=0.0,
    )
    assert v.status == "held"
    assert v.kv_held_s == pytest.approx(3.0)
    assert v.kv_held_peak_perc == pytest.approx(50.0)
    assert v.kv_seconds == pytest.approx(1.5)
    assert v.undelivered_peak_bytes == 4000
    assert "HELD" in v.line()


def test_none_when_kv_returns_to_zero_while_send_q_is_full():
    v = kv_held_verdict(
        _metrics([0.9, 0.8, 0.0, 0.0, 0.0, 0.0], [3, 2, 0, 0, 0, 0]),
        _sockets([0, 9000, 4000, 4000, 4000, 0]),
        t_first_send=0.0,
    )
    assert v.status == "none"
    assert v.window_s == pytest.approx(3.0)
    assert "none held" in v.line()


def test_not_observed_without_undelivered_data_or_too_short_a_window():
    no_send_q = kv_held_verdict(
        _metrics([0.9, 0.0, 0.0], [1, 0, 0]), _sockets([0, 0, 0]), t_first_send=0.0
    )
    assert no_send_q.status == "not_observed"
    short = kv_held_verdict(
        _metrics([0.9, 0.0, 0.0], [1, 0, 0]),
        _sockets([0, 10, 0]),
        t_first_send=0.0,
        min_observe_s=5.0,
    )
    assert short.status == "not_observed"


def test_generation_bound_counts_when_running_never_drops():
    # A coupled engine may keep reporting running requests; the bound decides.
    v = kv_held_verdict(
        _metrics([0.5, 0.5, 0.5, 0.5], [2, 2, 2, 2]),
        _sockets([100, 100, 100, 100]),
        t_first_send=0.0,
        generation_bound_s=1.0,
    )
    assert v.status == "held"
    assert v.t_generation_end == 1.0


def test_held_while_waiting_requests_are_stuck_behind_held_kv():
    # Coupled engine: nothing runs, 8 requests wait for blocks that undelivered streams hold.
    metrics = _metrics([0.9, 0.78, 0.78, 0.78, 0.0], [4, 0, 0, 0, 4])
    metrics["num_requests_waiting"] = [3, 8, 8, 8, 0]
    v = kv_held_verdict(metrics, _sockets([10, 900, 900, 900, 0]), t_first_send=0.0)
    assert v.status == "held"
    assert v.kv_held_s == pytest.approx(3.0)
    assert v.kv_held_peak_perc == pytest.approx(78.0)


def test_held_episode_spans_victims_that_flicker_in_and_out():
    # KV stays held for 4 s while a victim is admitted, preempted and re-admitted.
    v = kv_held_verdict(
        _metrics([0.9, 0.9, 0.95, 0.9, 0.95, 0.0], [0, 0, 1, 0, 1, 0]),
        _sockets([500, 500, 500, 500, 500, 0]),
        t_first_send=0.0,
    )
    assert v.status == "held"
    assert v.kv_held_s == pytest.approx(5.0)
    assert v.kv_held_peak_perc == pytest.approx(90.0)  # the held KV, not the victim's on top


def test_a_single_scrape_blip_right_after_generation_is_not_held():
    # The last bytes of a finished stream take a few ms to leave: one scrape may see KV > 0.
    v = kv_held_verdict(
        _metrics([0.8, 0.4, 0.3, 0.0, 0.0, 0.0], [4, 0, 6, 0, 0, 0]),
        _sockets([900, 900, 900, 900, 900, 0]),
        t_first_send=0.0,
    )
    assert v.status == "none", v


def test_the_held_peak_excludes_victims_running_meanwhile_and_held_time_fits_the_window():
    # generation ends at t=2 with 40 % held; a victim is admitted at t=4..5 (KV 90 %, running
    # 1), then only the held 40 % remain until t=7
    v = kv_held_verdict(
        _metrics([0.9, 0.8, 0.4, 0.4, 0.9, 0.9, 0.4, 0.0, 0.0], [3, 2, 0, 0, 1, 1, 0, 0, 0]),
        _sockets([0, 9000, 4000, 4000, 4000, 4000, 4000, 0, 0]),
        t_first_send=0.0,
    )
    assert v.status == "held"
    assert v.kv_held_peak_perc == pytest.approx(40.0)  # not the victim's 90 %
    assert v.kv_held_s == pytest.approx(5.0)  # t=2..7, the victim's run included
    assert v.kv_held_s <= v.window_s


def test_engine_costs_say_threads_memory_and_undelivered_bytes():
    from harness.analysis._verdicts import engine_costs

    server = {"server_threads_start": 7.0, "server_threads_peak": 13.0,
              "server_rss_growth_mb": 11.87, "server_rss_peak_mb": 70.4}  # fmt: skip
    costs = engine_costs(server, 456845.0)
    assert costs is not None
    assert costs["threads_peak"] == 13.0 and costs["rss_growth_mb"] == 11.87
    assert costs["line"] == (
        "engine process: threads 7 -> 13 at peak, RSS +11.9 MB (peak 70.4 MB), while up to "
        "0.46 MB sat undelivered in Send-Q"
    )
    assert engine_costs({"server_threads_start": None}, 0.0) is None  # a url target


def test_process_summary_uses_every_sample_answered_or_not():
    import pandas as pd

    from harness.analysis._summary import process_summary

    metrics = pd.DataFrame({
        "t": [0.0, 1.0, 2.0], "scrape_ok": [True, False, True],
        "server_threads": [7, 11, 9], "server_rss_bytes": [50e6, 61e6, 60e6],
    })  # fmt: skip
    assert process_summary(metrics) == {
        "server_threads_start": 7.0, "server_threads_peak": 11.0,
        "server_rss_peak_mb": 61.0, "server_rss_growth_mb": 11.0,
    }  # fmt: skip
    assert process_summary(metrics.drop(columns=["server_threads", "server_rss_bytes"])) == {}
