"""Comparison logic on frames built by the run's own code from request records: the buffering
flag, the comparison tables and files, engine-abort counting and matching, wasted decode."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

from harness.analysis._comparison import DistortionThresholds, compare
from harness.analysis._proxy import proxy_summary
from harness.analysis._stalls import abort_times, attribute_aborts, undelivered_tokens
from harness.analysis._summary import summarize_group, summarize_server
from harness.analysis._tables import chunks_frame, requests_frame
from harness.outputs import print_comparison, write_comparison
from harness.runfolder import ProxySummary, RunSummary, SaturationSummary
from loadgen import Chunk, RequestRecord


def _record(
    rid: str,
    group: str,
    *,
    t_send: float,
    ttft_s: float,
    gap_s: float,
    tokens: int,
    stall_after: int | None = None,
    cut_after_s: float | None = None,
) -> RequestRecord:
    """A stream whose first token comes ``ttft_s`` after the send and the next ones ``gap_s``
    apart; with ``stall_after``, the client stops reading after that many tokens and, with
    ``cut_after_s``, sees a RST that long after the stall began."""
    r = RequestRecord(rid, group, group, "none", "completions", tokens, 8, t_send, 0.0)
    n = tokens if stall_after is None else stall_after
    r.chunks = [Chunk(t=t_send + ttft_s + i * gap_s, tokens=1, bytes=300) for i in range(n)]
    r.t_first_token = r.chunks[0].t
    r.t_last_byte = r.chunks[-1].t
    r.completion_tokens = n
    r.outcome = "complete"
    r.t_end = r.t_last_byte + 0.001
    if stall_after is not None:
        t_stall = r.t_last_byte
        r.action, r.t_action = "stop_reading", t_stall
        r.stalls = [[t_stall, None]]
        r.outcome = "client_abort"
        if cut_after_s is not None:
            r.t_cut_seen, r.cut_kind, r.outcome = t_stall + cut_after_s, "rst", "cut_by_peer"
        r.t_end = t_stall + (cut_after_s or 10.0)
    return r


def _summary(records: list[RequestRecord], metrics: pd.DataFrame | None = None) -> RunSummary:
    requests = requests_frame(records, pd.DataFrame())
    chunks = chunks_frame(records)
    if metrics is None:
        metrics = pd.DataFrame({"t": [0.0], "scrape_ok": [True]})
    requests = attribute_aborts(requests, abort_times(metrics, requests["t_send"]))
    names = list(dict.fromkeys(r.group for r in records))
    return RunSummary(
        scenario="s",
        status="complete",
        failure=None,
        duration_s=10.0,
        groups=[summarize_group(n, requests, chunks) for n in names],
        server=summarize_server(metrics, [], requests),
        verdicts={},
        client_saturation=SaturationSummary(
            cpu_limit_pct=85,
            lag_limit_ms=5,
            max_fraction=0.1,
            processes=[],
            unsampled=[],
            saturated=False,
            message="",
        ),  # fmt: skip
        proxy=ProxySummary(
            name="x",
            kind="x",
            rss_peak_bytes=None,
            buffered_peak_bytes=None,
            stream_buffered_peak_mean_bytes=None,
            client_send_q_peak_bytes=None,
            upstream_recv_q_peak_bytes=None,
            cuts=None,
            upstream_aborts=None,
            samples=0,
        ),  # fmt: skip
    )


def _fast(ttft_s: float, gap_s: float, n: int = 5) -> list[RequestRecord]:
    return [
        _record(f"f{i}", "fast", t_send=i * 0.5, ttft_s=ttft_s, gap_s=gap_s, tokens=32)
        for i in range(n)
    ]


def test_buffering_proxy_is_flagged_with_numbers() -> None:
    summaries = {
        "none": _summary(_fast(ttft_s=0.020, gap_s=0.010)),
        # Delivered in bursts: the first token waits for a buffer to fill, then 1 ms gaps.
        "buffered": _summary(_fast(ttft_s=0.200, gap_s=0.001)),
        # Slower but streaming: later first token, same pace.
        "slow-hop": _summary(_fast(ttft_s=0.060, gap_s=0.010)),
    }
    kinds = {"none": "none", "buffered": "nginx", "slow-hop": "egress"}
    c = compare(summaries, kinds=kinds, healthy_groups=["fast"])
    verdicts = {d["configuration"]: d for d in c.distortion}
    assert set(verdicts) == {"buffered", "slow-hop"}
    b = verdicts["buffered"]
    assert b["status"] == "buffering", b
    ev = b["evidence"][0]
    assert ev["ttft_p50_ms"] == pytest.approx([20.0, 200.0])
    assert ev["inter_chunk_statistic"] == "p50"
    assert ev["inter_chunk_ms"] == pytest.approx([10.0, 1.0])
    assert ev["ttft_ratio"] == pytest.approx(10.0) and ev["inter_chunk_ratio"] == pytest.approx(0.1)
    assert "BUFFERS" in b["line"] and "20.0 -> 200.0" in b["line"]
    assert verdicts["slow-hop"]["status"] == "streaming"


def test_a_saturated_client_is_not_judged() -> None:
    buffered = _summary(_fast(ttft_s=0.200, gap_s=0.001))
    saturated = buffered.model_copy(
        update={"client_saturation": buffered.client_saturation.model_copy(
            update={"saturated": True})}
    )  # fmt: skip
    summaries = {"none": _summary(_fast(ttft_s=0.020, gap_s=0.010)), "buffered": saturated}
    c = compare(summaries, kinds={"none": "none", "buffered": "nginx"}, healthy_groups=["fast"])
    d = c.distortion[0]
    assert d["status"] == "not_evaluated" and d["evidence"]
    assert "client saturated in buffered" in d["line"] and "would say: BUFFERS" in d["line"]


def test_thresholds_decide_the_flag() -> None:
    summaries = {
        "none": _summary(_fast(ttft_s=0.020, gap_s=0.010)),
        "mild": _summary(_fast(ttft_s=0.030, gap_s=0.007)),  # x1.5 TTFT, x0.7 gaps
    }
    kinds = {"none": "none", "mild": "nginx"}
    assert compare(summaries, kinds=kinds, healthy_groups=["fast"]).distortion[0]["status"] == (
        "buffering"
    )
    strict = DistortionThresholds(ttft_rise_ratio=2.0)
    c = compare(summaries, kinds=kinds, healthy_groups=["fast"], thresholds=strict)
    assert c.distortion[0]["status"] == "streaming"
    tiny = DistortionThresholds(min_ttft_rise_ms=50)
    c = compare(summaries, kinds=kinds, healthy_groups=["fast"], thresholds=tiny)
    assert c.distortion[0]["status"] == "streaming"


def test_without_baseline_or_healthy_group_not_evaluated() -> None:
    summaries = {"a": _summary(_fast(0.02, 0.01)), "b": _summary(_fast(0.2, 0.001))}
    c = compare(summaries, kinds={"a": "nginx", "b": "egress"}, healthy_groups=["fast"])
    assert c.baseline is None
    assert [d["status"] for d in c.distortion] == ["not_evaluated"] * 2
    c = compare(summaries, kinds={"a": "none", "b": "egress"}, healthy_groups=[])
    assert c.distortion[0]["status"] == "not_evaluated"
    assert "no healthy reader group" in c.distortion[0]["line"]


def _coalesced(ttft_s: float, burst: int, gap_s: float) -> list[RequestRecord]:
    """Fast streams whose chunks arrive ``burst`` per read, reads ``gap_s`` apart."""
    records = _fast(ttft_s, 0.0)
    for r in records:
        for i, c in enumerate(r.chunks):
            c.t = r.t_send + ttft_s + (i // burst) * gap_s
        r.t_last_byte = r.chunks[-1].t
    return records


def test_a_client_that_reads_chunks_together_is_judged_on_the_mean_gap() -> None:
    # Without a proxy the client already reads 4 chunks per read (gap p50 = 0 ms).
    summaries = {
        "none": _summary(_coalesced(0.02, burst=4, gap_s=0.04)),
        "buffered": _summary(_coalesced(0.3, burst=32, gap_s=0.04)),
        "streaming": _summary(_coalesced(0.025, burst=4, gap_s=0.04)),
    }
    kinds = {"none": "none", "buffered": "nginx", "streaming": "egress"}
    c = compare(summaries, kinds=kinds, healthy_groups=["fast"])
    assert summaries["none"].groups[0].inter_chunk_p50_ms == 0
    verdicts = {d["configuration"]: d for d in c.distortion}
    assert verdicts["buffered"]["status"] == "buffering", verdicts["buffered"]
    assert verdicts["buffered"]["evidence"][0]["inter_chunk_statistic"] == "mean"
    assert "inter-chunk mean" in verdicts["buffered"]["line"]
    assert verdicts["streaming"]["status"] == "streaming", verdicts["streaming"]


def test_a_baseline_without_gaps_cannot_be_judged() -> None:
    summaries = {"none": _summary(_fast(0.02, 0.0)), "b": _summary(_fast(0.2, 0.001))}
    c = compare(summaries, kinds={"none": "none", "b": "nginx"}, healthy_groups=["fast"])
    assert c.distortion[0]["status"] == "not_evaluated"
    assert "no TTFT or inter-chunk latency to compare in none" in c.distortion[0]["line"]


def _metrics(rows: list[tuple[float, int, int, int, int, int]]) -> pd.DataFrame:
    """(t, running, waiting, success_length, success_abort, generation_tokens_total)"""
    cols = ["t", "num_requests_running", "num_requests_waiting", "request_success_length",
            "request_success_abort", "generation_tokens_total"]  # fmt: skip
    frame = pd.DataFrame(rows, columns=cols)
    frame["scrape_ok"] = True
    return frame


def test_aborts_are_counted_by_conservation_and_matched_in_order() -> None:
    # Two stalled streams (sent at 0 and 0.1, stalled at ~0.1 and ~0.2) and one fast one.
    records = [
        _record("s1", "stalled", t_send=0.0, ttft_s=0.02, gap_s=0.01, tokens=500,
                stall_after=8, cut_after_s=2.0),
        _record("s2", "stalled", t_send=0.1, ttft_s=0.02, gap_s=0.01, tokens=500,
                stall_after=8, cut_after_s=2.0),
        _record("f", "fast", t_send=0.05, ttft_s=0.02, gap_s=0.01, tokens=20),
    ]  # fmt: skip
    # The server does not count aborts (vLLM): running drops without a success.
    # At t=0.05 s a request is sent but not yet queued at the server: a blip to ignore.
    metrics = _metrics([
        (-0.5, 0, 0, 0, 0, 0),
        (0.06, 1, 0, 0, 0, 10),
        (0.5, 2, 0, 1, 0, 100),
        (1.0, 2, 0, 1, 0, 200),
        (2.5, 1, 0, 1, 0, 500),  # first abort seen here
        (3.0, 0, 0, 1, 0, 560),  # second
        (4.0, 0, 0, 1, 0, 560),
    ])  # fmt: skip
    requests = requests_frame(records, pd.DataFrame())
    assert abort_times(metrics, requests["t_send"]) == [2.5, 3.0]
    out = attribute_aborts(requests, [2.5, 3.0]).set_index("request_id")
    assert out.loc["s1", "t_engine_abort"] == 2.5 and out.loc["s2", "t_engine_abort"] == 3.0
    assert pd.isna(out.loc["f", "t_engine_abort"])
    assert out.loc["s1", "stall_to_abort_ms"] == pytest.approx((2.5 - 0.09) * 1000)
    summary = _summary(records, metrics)
    stalled = next(g for g in summary.groups if g.group == "stalled")
    assert stalled.stalled == 2 and stalled.cut_seen == 2 and stalled.cut_rst == 2
    assert stalled.stall_to_cut_p50_ms == pytest.approx(2000.0)
    assert stalled.engine_aborted == 2
    assert stalled.stall_to_abort_max_ms == pytest.approx((3.0 - 0.19) * 1000)
    # Generated 560, received 8 + 8 + 20.
    assert summary.server.generation_tokens == 560
    assert summary.server.undelivered_tokens == 560 - 36
    assert undelivered_tokens(metrics.drop(columns="generation_tokens_total"), requests) is None


def test_an_engine_that_counts_aborts_gives_the_same_answer() -> None:
    records = [_record("s1", "stalled", t_send=0.0, ttft_s=0.02, gap_s=0.01, tokens=500,
                       stall_after=8, cut_after_s=2.0)]  # fmt: skip
    metrics = _metrics([(-0.5, 0, 0, 0, 0, 0), (1.0, 1, 0, 0, 0, 50), (2.5, 0, 0, 0, 1, 80)])
    requests = requests_frame(records, pd.DataFrame())
    assert abort_times(metrics, requests["t_send"]) == [2.5]


def test_finished_requests_are_not_aborts() -> None:
    records = _fast(0.02, 0.01, n=2)
    metrics = _metrics([(-0.5, 0, 0, 0, 0, 0), (0.3, 1, 0, 0, 0, 10), (2.0, 0, 0, 2, 0, 64)])
    requests = requests_frame(records, pd.DataFrame())
    assert abort_times(metrics, requests["t_send"]) == []


def test_comparison_files_and_table(tmp_path: Path) -> None:
    stalled = _record("s", "stalled", t_send=0.0, ttft_s=0.02, gap_s=0.01, tokens=500,
                      stall_after=8, cut_after_s=2.5)  # fmt: skip
    summaries = {
        "none": _summary(_fast(0.02, 0.01) + [stalled]),
        "egress": _summary(_fast(0.025, 0.01) + [stalled]),
    }
    c = compare(summaries, kinds={"none": "none", "egress": "egress"}, healthy_groups=["fast"])
    write_comparison(c, tmp_path, title="t")
    data = json.loads((tmp_path / "comparison.json").read_text())
    assert [(r["configuration"], r["group"]) for r in data["groups"]] == [
        ("none", "fast"), ("none", "stalled"), ("egress", "fast"), ("egress", "stalled"),
    ]  # fmt: skip
    row = data["groups"][3]
    assert row["stall_to_cut_p50_ms"] == pytest.approx(2500.0) and row["cut_rst"] == 1
    assert row["stall_to_abort_p50_ms"] is None  # no metrics, no abort estimate
    md = (tmp_path / "comparison.md").read_text()
    assert "| egress | stalled | 1 | cut_by_peer 1 |" in md
    console = Console(record=True, width=250)
    print_comparison(c, title="t", console=console)
    text = console.export_text()
    assert "stall->cut p50" in text and "2,500.0" in text and "egress: streams" in text


def test_proxy_summary_from_probe_rows() -> None:
    rows = [
        {"t": 0.0, "rss_bytes": 10, "buffered_bytes": 0, "client_send_q_bytes": 0,
         "upstream_recv_q_bytes": 0, "cuts": 1.0, "upstream_aborts": 1.0,
         "stream_peak_sum": 1000.0, "stream_peak_count": 1.0},
        {"t": 0.25, "rss_bytes": 30, "buffered_bytes": 5000, "client_send_q_bytes": 700,
         "upstream_recv_q_bytes": 9, "cuts": 3.0, "upstream_aborts": 4.0,
         "stream_peak_sum": 7000.0, "stream_peak_count": 3.0},
    ]  # fmt: skip
    rows[0]["cuts_overflow"], rows[1]["cuts_overflow"] = 0.0, 2.0
    rows[0]["cuts_stall_timeout"], rows[1]["cuts_stall_timeout"] = 1.0, 1.0
    s = proxy_summary("egress", "egress", rows)
    assert s.cut_reasons == {"overflow": 2.0}  # reasons that did not rise are left out
    assert (s.rss_peak_bytes, s.buffered_peak_bytes, s.client_send_q_peak_bytes) == (30, 5000, 700)
    assert s.cuts == 2 and s.upstream_aborts == 3
    assert s.stream_buffered_peak_mean_bytes == 3000  # (7000 - 1000) / (3 - 1)
    empty = proxy_summary("none", "none", [])
    assert empty.rss_peak_bytes is None and empty.client_send_q_peak_bytes is None


_SCENARIO = """name = "x"
[target]
kind = "sim"
[[groups]]
name = "g"
users = 1
requests_per_user = 1
"""


def test_scenario_proxies_named_beside_their_fields() -> None:
    from harness.scenario import parse_scenario

    text = (
        _SCENARIO
        + """
[[proxies]]
kind = "none"
[[proxies]]
name = "nginx-buffered"
kind = "nginx"
send_timeout_s = 3
"""
    )
    s = parse_scenario(text, path=Path("x.toml"))
    assert [p.name for p in s.proxies] == ["none", "nginx-buffered"]  # default: the kind
    assert s.proxies[1].proxy.send_timeout_s == 3  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('[[proxies]]\nkind = "nginx"\nsend_timeout_s = -1\n',
         "x.toml:10: field 'proxies.0.send_timeout_s'"),
        ('[[proxies]]\nkind = "none"\n[[proxies]]\nkind = "none"\n',
         "proxy names must be unique; repeated: none"),
        ('[proxy]\nkind = "egress"\n[[proxies]]\nkind = "none"\n',
         "set either proxy or proxies, not both"),
    ],
)  # fmt: skip
def test_scenario_proxies_errors(extra: str, message: str) -> None:
    from harness.scenario import ScenarioError, parse_scenario

    with pytest.raises(ScenarioError) as err:
        parse_scenario(_SCENARIO + extra, path=Path("x.toml"))
    assert message in str(err.value), str(err.value)


def test_an_abort_is_never_dated_before_a_scrape_gap() -> None:
    # The harness was starved: no scrape between -0.5 s and 5 s, while the stalled stream was
    # sent (0 s) and aborted; a late-answering scrape at 6 s counts a request sent at 6.05 s.
    records = [
        _record("s", "stalled", t_send=0.0, ttft_s=0.02, gap_s=0.01, tokens=500,
                stall_after=8, cut_after_s=2.0),
        _record("f", "fast", t_send=6.05, ttft_s=0.02, gap_s=0.01, tokens=20),
    ]  # fmt: skip
    metrics = _metrics([
        (-0.5, 0, 0, 0, 0, 0),
        (5.0, 0, 0, 0, 0, 300),
        (6.0, 1, 0, 0, 0, 301),  # answered after 6.05: the fast request already runs
        (7.0, 0, 0, 1, 0, 320),
    ])  # fmt: skip
    requests = requests_frame(records, pd.DataFrame())
    assert abort_times(metrics, requests["t_send"]) == [5.0]


def test_nginx_temp_files_are_counted_while_open_after_unlink(tmp_path: Path) -> None:
    """nginx unlinks a temporary file as soon as it has opened it; its bytes still count."""
    import os

    from harness.collectors._proxy_probe import dir_bytes

    temp = tmp_path / "proxy_temp" / "1"
    temp.mkdir(parents=True)
    (temp / "kept").write_bytes(b"k" * 1000)
    with open(temp / "0000000001", "wb") as f:
        os.unlink(temp / "0000000001")
        f.write(b"x" * 5000)
        f.flush()
        assert dir_bytes(tmp_path / "proxy_temp") == 1000  # the folder alone misses it
        assert dir_bytes(tmp_path / "proxy_temp", [os.getpid()]) == 6000
        assert dir_bytes(tmp_path / "nowhere", [os.getpid()]) == 0


def test_free_port_for_an_address_of_a_namespace_not_made_yet() -> None:
    from harness.servers._health import free_port

    # 198.19.0.0/16 (RFC 2544) is the runs' host-link range: not on this host's interfaces.
    assert 0 < free_port("198.19.255.253") < 65536
