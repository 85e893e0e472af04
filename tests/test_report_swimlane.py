"""The report's per-request swimlane, from synthetic run folders: the engine's spans joined by
``engine_request_id`` above, the client's below, slowest first, and a note instead of the
engine row when the run has no engine table or no join columns; under it, each proxy hop over
time (``proxy.parquet``), with or without the ``hop`` column."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from harness._engine_probe import REQUEST_SCHEMA
from harness.analysis import client_spans, engine_spans, preempted, subtract
from harness.outputs._report import render_report
from harness.outputs._report._data import hop_samples, load_run
from harness.outputs._report._swimlane import swimlane
from loadgen import RecordWriter, RequestRecord
from tests._chromium import needs_chromium

T0 = 1000.0  # monotonic s of the first send: the report's time origin

# (request_id, group, t_send, t_first_byte, t_last_byte, t_end, e2e_ms, t_stall, stall_s,
#  t_cut_seen, cut_kind, engine_request_id, delivery_lag_ms, kv_held_ms, undelivered_at_free)
REQUESTS = [
    ("fast0000aaaa", "fast", 1000.0, 1000.05, 1001.0, 1001.0, 1000.0, None, 0.0, None, None,
     "cmpl-fast0000aaaa-0-1", 10.0, 0.0, 0),
    ("slow1111bbbb", "slow", 1000.2, 1000.3, 1008.0, 1008.0, 7800.0, 1001.0, 6.5, None, None,
     "cmpl-slow1111bbbb-0-2", 5000.0, 4900.0, 1234),
    ("cut22222cccc", "slow", 1000.3, 1000.4, 1000.9, 1004.0, 3700.0, 1000.9, 3.1, 1004.0, "rst",
     "cmpl-cut22222cccc-0-3", None, 0.0, None),
    ("lost3333dddd", "fast", 1000.1, 1000.15, 1000.6, 1000.6, 500.0, None, 0.0, None, None,
     None, None, None, None),
]  # fmt: skip
ENGINE = [  # engine_request_id, arrival, first scheduled, first token, generation end, KV freed,
    # finish reason, preempted_at, resumed_at
    ("cmpl-fast0000aaaa-0-1", 1000.01, 1000.02, 1000.09, 1000.99, 1000.99, "length", [], []),
    ("cmpl-slow1111bbbb-0-2", 1000.21, 1000.5, 1000.6, 1003.0, 1007.9, "length",
     [1001.5], [1002.0]),
    ("cmpl-cut22222cccc-0-3", 1000.31, 1000.32, 1000.4, 1004.05, 1004.05, "abort", [1001.0], []),
    ("cmpl-unrelated-0-9", 1000.0, 1000.1, 1000.2, 1000.3, 1000.3, "stop", [], []),
]  # fmt: skip


def requests_frame(rows: list[tuple] = REQUESTS) -> pd.DataFrame:
    cols = ["request_id", "group", "t_send", "t_first_byte", "t_last_byte", "t_end", "e2e_ms",
            "t_stall", "stall_s", "t_cut_seen", "cut_kind", "engine_request_id",
            "delivery_lag_ms", "kv_held_after_generation_ms",
            "undelivered_bytes_at_kv_free"]  # fmt: skip
    df = pd.DataFrame(rows, columns=cols)
    df["user_class"] = df["group"]
    df["outcome"] = df["cut_kind"].map(lambda kind: "cut_by_peer" if pd.notna(kind) else "complete")
    df["t_first_token"] = df["t_first_byte"] + 0.01
    df["ttft_ms"] = (df["t_first_token"] - df["t_send"]) * 1000.0
    df["bytes_received"] = 4000
    df["undelivered_bytes_at_generation_end"] = df["undelivered_bytes_at_kv_free"]
    df["stream_id"] = "cmpl-" + df["request_id"]
    return df


def engine_frame(rows: list[tuple] = ENGINE) -> pa.Table:
    cols = ["engine_request_id", "t_arrival", "t_first_scheduled", "t_first_token",
            "t_generation_end", "t_kv_freed", "finish_reason", "preempted_at",
            "resumed_at"]  # fmt: skip
    data = {c: [r[i] for r in rows] for i, c in enumerate(cols)}
    for c in REQUEST_SCHEMA.names:
        data.setdefault(c, [None] * len(rows))
    return pa.table(data, schema=REQUEST_SCHEMA)


def make_run(path: Path, *, engine: bool = True, join: bool = True, records: bool = True) -> Path:
    """A run folder with summary.json, requests.parquet, records and (``engine``)
    engine_requests.parquet; ``join=False`` drops the join columns (an older analysis)."""
    path.mkdir(parents=True, exist_ok=True)
    summary = {"scenario": "swim", "status": "complete", "duration_s": 8.0, "groups": []}
    (path / "summary.json").write_text(json.dumps(summary))
    req = requests_frame()
    if not join:
        req = req.drop(columns=["engine_request_id", "delivery_lag_ms",
                                "kv_held_after_generation_ms", "undelivered_bytes_at_kv_free",
                                "undelivered_bytes_at_generation_end"])  # fmt: skip
    req.to_parquet(path / "requests.parquet", index=False)
    if engine:
        pq.write_table(engine_frame(), path / "engine_requests.parquet")
    if records:
        writer = RecordWriter(path / "records-slow.jsonl")
        writer.write(RequestRecord(
            request_id="slow1111bbbb", user_class="slow", group="slow", network_profile="none",
            endpoint="completions", max_tokens=64, prompt_tokens_requested=8, t_send=1000.2,
            t_send_wall=0.0, stalls=[[1001.0, 1004.0], [1005.0, 1007.5]],
        ))  # fmt: skip
        writer.close()
    return path


def add_proxy(run: Path, *, hops: bool = True) -> Path:
    """Proxy samples in ``run``: two hops (traefik, litellm) with their summaries, or
    (``hops=False``) a single nginx's samples as written before every hop was probed (no ``hop``
    column, no ``proxy.hops``)."""
    rows = []
    for i in range(9):
        t = 1000.0 + i
        rows.append(
            {
                "t": t,
                "hop": 0,
                "rss_bytes": 9e7,
                "client_send_q_bytes": 100 * i,
                "upstream_recv_q_bytes": 10,
                "metrics_ok": True,
                "requests": float(i),
            }
        )
        rows.append({"t": t + 0.05, "hop": 1, "rss_bytes": 4e8, "client_send_q_bytes": 7,
                     "upstream_recv_q_bytes": 50 * i, "metrics_ok": True})  # fmt: skip
    frame = pd.DataFrame(rows)
    summary = json.loads((run / "summary.json").read_text())
    summary["proxy"] = {"name": "chain", "kind": "chain", "rss_peak_bytes": 9e7, "samples": 9}
    if hops:
        summary["proxy"]["hops"] = [
            {"index": 0, "kind": "traefik", "port": 8000, "send_q_peak_bytes": 900,
             "samples": 9, "rss_peak_bytes": 90000000, "client_send_q_peak_bytes": 800,
             "metrics": {"requests": 8.0, "open_connections_peak": 3.0}},
            {"index": 1, "kind": "litellm", "port": 8001, "send_q_peak_bytes": 7, "samples": 9},
        ]  # fmt: skip
    else:
        frame = frame[frame["hop"] == 0].drop(columns=["hop", "metrics_ok", "requests"])
        summary["proxy"].update(name="nginx", kind="nginx")
    frame.to_parquet(run / "proxy.parquet", index=False)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def spans_of(lanes, lane: int, row: str) -> list[tuple[str, float, float]]:
    return [(s.kind, round(s.start_s, 6), round(s.end_s, 6))
            for s in lanes.spans if s.lane == lane and s.row == row]  # fmt: skip


def test_subtract_leaves_the_pieces_outside_the_holes():
    assert subtract(0.0, 10.0, [(2.0, 3.0), (5.0, 6.0)]) == [(0.0, 2.0), (3.0, 5.0), (6.0, 10.0)]
    assert subtract(0.0, 10.0, [(-1.0, 1.0), (9.0, 12.0)]) == [(1.0, 9.0)]
    assert subtract(0.0, 10.0, [(-1.0, 11.0)]) == []
    assert subtract(0.0, 10.0, []) == [(0.0, 10.0)]


def test_engine_spans_take_preemptions_out_of_decode():
    row = pd.Series(dict(zip(
        ["t_arrival", "t_first_scheduled", "t_first_token", "t_generation_end", "t_kv_freed",
         "preempted_at", "resumed_at"],
        [1.0, 2.0, 3.0, 10.0, 12.0, [4.0, 7.0], [5.0]], strict=True,
    )))  # fmt: skip
    assert preempted(row) == [(4.0, 5.0), (7.0, 10.0)]  # the second never resumed
    assert engine_spans(row) == [
        ("queued", 1.0, 2.0), ("prefill", 2.0, 3.0), ("decode", 3.0, 4.0), ("decode", 5.0, 7.0),
        ("preempted", 4.0, 5.0), ("preempted", 7.0, 10.0), ("kv_held", 10.0, 12.0),
    ]  # fmt: skip


def test_engine_spans_show_generation_waiting_for_delivery_with_the_engine_kept():
    """llama-cpp-python's shape: generation drips from 5.0 (waits merged into one span), its
    last token at 6.0, the lock released at 14.0 when the client left."""
    row = pd.Series(dict(zip(
        ["t_arrival", "t_first_scheduled", "t_first_token", "t_generation_end", "t_kv_freed",
         "send_blocked_at", "send_unblocked_at"],
        [1.0, 1.0, 1.5, 6.0, 14.0, [5.0], [14.0]], strict=True,
    )))  # fmt: skip
    assert engine_spans(row) == [
        ("prefill", 1.0, 1.5), ("decode", 1.5, 5.0), ("send_blocked", 5.0, 14.0),
    ]  # fmt: skip  # no "KV held after generation": generation never ended, it waited


def test_engine_spans_with_moments_that_never_came():
    """Aborted before its first token: prefill runs to the abort; no KV held after it."""
    row = pd.Series({"t_arrival": 1.0, "t_first_scheduled": 2.0, "t_first_token": float("nan"),
                     "t_generation_end": 4.0, "t_kv_freed": 4.0, "preempted_at": None,
                     "resumed_at": None})  # fmt: skip
    assert engine_spans(row) == [("queued", 1.0, 2.0), ("prefill", 2.0, 4.0)]
    never = pd.Series({"t_arrival": 1.0, "t_first_scheduled": None, "t_first_token": None,
                       "t_generation_end": None, "t_kv_freed": 3.0})  # fmt: skip
    assert engine_spans(never) == [("queued", 1.0, 3.0)]


def test_client_spans_from_records_or_from_t_stall():
    req = pd.Series({"t_send": 0.0, "t_first_byte": 1.0, "t_last_byte": 9.0, "t_end": 10.0,
                     "t_stall": 2.0, "stall_s": 3.0})  # fmt: skip
    assert client_spans(req, [[2.5, 4.0], [6.0, None]]) == [
        ("waiting", 0.0, 1.0), ("receiving", 1.0, 2.5), ("receiving", 4.0, 6.0),
        ("stalled", 2.5, 4.0), ("stalled", 6.0, 10.0),  # never resumed: to the end
    ]  # fmt: skip
    assert client_spans(req, None) == [
        ("waiting", 0.0, 1.0), ("receiving", 1.0, 2.0), ("receiving", 5.0, 9.0),
        ("stalled", 2.0, 5.0),
    ]  # fmt: skip
    no_answer = pd.Series({"t_send": 0.0, "t_first_byte": None, "t_last_byte": None,
                           "t_end": 30.0})  # fmt: skip
    assert client_spans(no_answer, []) == [("waiting", 0.0, 30.0)]


def test_lanes_are_joined_by_engine_id_and_slowest_first(tmp_path):
    lanes = swimlane(load_run(make_run(tmp_path / "run")))
    assert lanes.note is None and lanes.has_engine
    assert lanes.labels == ["slow · slow1111", "slow · cut22222", "fast · fast0000",
                            "fast · lost3333"]  # fmt: skip
    assert lanes.omitted == 0 and lanes.engine_rows == 3 and lanes.unmatched == 1
    # slow1111bbbb: preempted 1.5-2.0 s, KV held from generation end (3.0) to 7.9 s.
    assert spans_of(lanes, 0, "engine") == [
        ("queued", 0.21, 0.5), ("prefill", 0.5, 0.6), ("decode", 0.6, 1.5), ("decode", 2.0, 3.0),
        ("preempted", 1.5, 2.0), ("kv_held", 3.0, 7.9),
    ]  # fmt: skip
    # Waiting until its first token (10 ms after the first byte); its two stalls come from the
    # records.
    assert spans_of(lanes, 0, "client") == [
        ("waiting", 0.2, 0.31), ("receiving", 0.31, 1.0), ("receiving", 4.0, 5.0),
        ("receiving", 7.5, 8.0), ("stalled", 1.0, 4.0), ("stalled", 5.0, 7.5),
    ]  # fmt: skip
    # cut22222cccc: preempted and never resumed (to the abort); no record: t_stall + stall_s.
    assert ("preempted", 1.0, 4.05) in spans_of(lanes, 1, "engine")
    assert ("stalled", 0.9, 4.0) in spans_of(lanes, 1, "client")
    marks = {(m.lane, m.kind, round(m.s, 6)) for m in lanes.marks}
    assert (0, "kv_freed", 7.9) in marks and (1, "cut_rst", 4.0) in marks
    assert spans_of(lanes, 3, "engine") == []  # no engine id: no engine row
    assert "delivery lag 5,000 ms" in lanes.numbers[0]
    assert "KV held after generation 4,900 ms" in lanes.numbers[0]
    assert "at KV free 1,234" in lanes.numbers[0]


def test_report_puts_the_swimlane_first(tmp_path):
    html = render_report(make_run(tmp_path / "run"))
    swim, timeline = html.index('id="swimlane"'), html.index('id="timeline"')
    assert swim < html.index("<h2>Verdicts</h2>") < timeline
    assert "Upper row: what the engine did" in html and "no engine row:" not in html
    assert "1 of the 4 requests shown matched no engine row" in html
    for label in ("KV held after generation", "preempted", "KV freed", "cut seen (RST)",
                  "stalled (not reading)", "waiting for the first token"):  # fmt: skip
        assert f'"name":"{label}"' in html, label
    assert "delivery lag 5,000 ms" in html and "faster request" not in html


def test_only_the_slowest_lanes_are_drawn(tmp_path):
    run = make_run(tmp_path / "run", engine=False)
    many = [(f"{i:04d}eeeeeeee", "bulk", 1000.0 + i * 0.01, 1000.1 + i * 0.01, 1000.5, 1000.5,
             (0.5 - i * 0.01) * 1000, None, 0.0, None, None, None, None, None, None)
            for i in range(45)]  # fmt: skip
    requests_frame(REQUESTS + many).to_parquet(run / "requests.parquet", index=False)
    lanes = swimlane(load_run(run), max_lanes=40)
    assert len(lanes.labels) == 40 and lanes.omitted == 9
    assert lanes.labels[:4] == ["slow · slow1111", "slow · cut22222", "fast · fast0000",
                                "fast · lost3333"]  # fmt: skip
    assert "bulk · 0044eeee" not in lanes.labels  # the fastest are left out
    assert "9 faster requests not shown (the 40 slowest are)" in render_report(run)


@pytest.mark.parametrize(
    ("engine", "join", "why"),
    [
        (False, True, "the engine wrote no per-request table (engine_requests.parquet): "
                      "scrape-only"),
        (True, False, "requests.parquet has no engine_request_id"),
    ],
)  # fmt: skip
def test_without_engine_data_only_the_client_row(tmp_path, engine, join, why):
    run = make_run(tmp_path / "run", engine=engine, join=join)
    lanes = swimlane(load_run(run))
    assert not lanes.has_engine and why in (lanes.note or "")
    assert {s.row for s in lanes.spans} == {"client"}
    assert {m.kind for m in lanes.marks} == {"cut_rst"}
    assert len(lanes.labels) == 4 and lanes.unmatched == 0
    html = render_report(run)
    assert why in html and "Client only" in html and "Upper row" not in html
    assert '"name":"decode"' not in html and '"name":"receiving"' in html


def test_unreadable_engine_table_is_a_note_not_a_failure(tmp_path):
    """An engine killed before it wrote its Parquet footer: the report still renders."""
    run = make_run(tmp_path / "run")
    (run / "engine_requests.parquet").write_bytes(b"PAR1 half a file")
    html = render_report(run)
    assert "no engine row:" in html and "cannot read Parquet" in html
    assert 'id="swimlane"' in html


def test_join_without_any_match_says_so(tmp_path):
    run = make_run(tmp_path / "run")
    req = pd.read_parquet(run / "requests.parquet")
    req["engine_request_id"] = None
    req.to_parquet(run / "requests.parquet", index=False)
    lanes = swimlane(load_run(run))
    assert lanes.note == "no engine row: no request matched a row of engine_requests.parquet"


def test_each_proxy_hop_is_drawn_over_time_under_the_lanes(tmp_path):
    run = add_proxy(make_run(tmp_path / "run"))
    hops = hop_samples(load_run(run))
    assert list(hops) == ["hop 0 traefik", "hop 1 litellm"]
    assert hops["hop 0 traefik"]["s"].iloc[0] == 0.0  # the report's time axis
    html = render_report(run)
    swim, under = html.index('id="swimlane"'), html.index('id="hops-timeline"')
    assert swim < under < html.index("<h2>Verdicts</h2>")
    for trace in ('"name":"hop 0 traefik"', '"name":"hop 1 litellm"', "Recv-Q from upstream"):
        assert trace in html, trace
    assert "requests 8, open_connections_peak 3" in html  # the hop table's own metrics
    assert "cannot be told per request" in html
    assert '<td class="k">hops</td>' not in html  # not dumped again in the generic proxy table


def test_proxy_samples_without_hops_are_the_single_proxys(tmp_path):
    run = add_proxy(make_run(tmp_path / "run"), hops=False)
    assert list(hop_samples(load_run(run))) == ["hop 0 nginx"]
    html = render_report(run)
    assert '"name":"hop 0 nginx"' in html and "Send-Q toward the clients" in html


def test_no_requests_no_swimlane(tmp_path):
    run = make_run(tmp_path / "run", records=False)
    requests_frame().iloc[0:0].to_parquet(run / "requests.parquet", index=False)
    html = render_report(run)
    assert 'id="swimlane"' not in html and "<strong>no request</strong>" in html


@needs_chromium
def test_swimlane_draws_in_chromium(tmp_path):
    from tests._chromium import open_page

    run = add_proxy(make_run(tmp_path / "run"))
    (run / "report.html").write_text(render_report(run))
    check = """(() => {
      const hops = document.getElementById('hops-timeline');
      const hopLines = [...hops.querySelectorAll('g.scatterlayer path.js-line')]
        .filter(p => (p.getAttribute('d') || '').length > 10).length;
      const div = document.getElementById('swimlane');
      const bars = [...div.querySelectorAll('g.barlayer path')]
        .filter(p => (p.getAttribute('d') || '').length > 4).length;
      const points = div.querySelectorAll('g.scatterlayer path.point').length;
      const ticks = [...div.querySelectorAll('g.ytick text')].map(t => t.textContent);
      return {bars, points, ticks, hopLines,
              legend: div.querySelectorAll('g.legend g.traces').length};
    })()"""  # fmt: skip
    page = open_page((run / "report.html").resolve().as_uri(), check)
    (tmp_path / "swimlane.png").write_bytes(page.screenshot)
    assert page.console_errors == [] and page.external_requests == []
    drawn = page.value
    assert drawn["bars"] >= 20, drawn
    assert drawn["points"] >= 4, drawn  # three KV freed, one cut
    assert drawn["ticks"][0] == "slow · slow1111", drawn
    assert drawn["legend"] >= 9, drawn
    assert drawn["hopLines"] == 6, drawn  # two hops in three rows: Send-Q, Recv-Q, RSS
