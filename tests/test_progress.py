"""Live progress: records tailed as the load processes write them, plain lines and the rich
display (a real run's progress is checked in test_gates_run.py)."""

from __future__ import annotations

import io
import time

from rich.console import Console

from harness.lifecycle._progress import RunProgress, _record_head
from loadgen import Chunk, RecordWriter, RequestRecord, group_file


def _record(group: str, i: int, ttft_s: float | None) -> RequestRecord:
    t = 100.0 + i
    return RequestRecord(
        request_id=f"{group}-{i}",
        user_class=group,
        group=group,
        network_profile="none",
        endpoint="completions",
        max_tokens=4,
        prompt_tokens_requested=8,
        t_send=t,
        t_send_wall=1.0,
        outcome="complete" if ttft_s is not None else "http_error",
        t_first_token=None if ttft_s is None else t + ttft_s,
        chunks=[Chunk(t=t + 0.5, tokens=1, bytes=10, text='a"b,"chunks":')] * 3,
    )


def test_record_head_reads_the_scalars_before_the_chunks():
    line = _record("fast", 1, 0.25).to_json().encode()
    head = _record_head(line)
    assert head is not None
    assert head["t_first_token"] - head["t_send"] == 0.25 and "chunks" not in head
    assert _record_head(b"not json") is None


def test_plain_lines_count_finished_requests_and_ttft_p50(tmp_path):
    out = io.StringIO()
    progress = RunProgress(Console(file=out, width=300), live=False, interval_s=3600, poll_s=0)
    progress.start(scenario="s", run_dir=tmp_path, groups=["fast", "slow"], max_duration_s=60)
    writer = RecordWriter(group_file(tmp_path, "records", "fast", None))
    for i, ttft in enumerate((0.010, 0.030, 0.020, None)):
        writer.write(_record("fast", i, ttft))
    # A line still being written is not counted until it is complete.
    with open(group_file(tmp_path, "records", "slow", None), "w") as f:
        f.write(_record("slow", 0, 0.5).to_json()[:40])
    t_load = time.monotonic()
    progress.update("load", t_load=t_load, metrics={"scrape_ok": True, "kv_cache_usage": 0.5,
                                                    "num_requests_running": 3,
                                                    "num_requests_waiting": 1})  # fmt: skip
    line = progress.line()
    assert "s: load, at most 60 s left; 4 requests finished" in line
    assert "fast 4 (TTFT p50 20 ms), slow 0 (TTFT p50 - ms)" in line
    assert "KV cache 50.0 %, running 3, waiting 1" in line
    with open(group_file(tmp_path, "records", "slow", None), "a") as f:
        f.write(_record("slow", 0, 0.5).to_json()[40:] + "\n")
    progress.update("cooldown", t_load=t_load, metrics={"scrape_ok": False})
    assert "slow 1 (TTFT p50 500 ms)" in progress.line()
    assert "KV cache 50.0 %" in progress.line()  # a failed scrape keeps the last good sample
    progress.stop()
    printed = out.getvalue().splitlines()
    # One line per phase change (the interval is an hour) and one at the end.
    assert [ln.split("s: ")[1].split(";")[0].split(",")[0] for ln in printed] == [
        "load",
        "cooldown",
        "done",
    ]
    writer.close()


def test_workers_records_are_counted(tmp_path):
    """With --workers each Locust worker writes records-<group>@<worker>.jsonl; the progress
    line counts them all, including a worker whose file appears after the run started."""
    progress = RunProgress(Console(file=io.StringIO(), width=300), live=False, poll_s=0)
    progress.start(scenario="s", run_dir=tmp_path, groups=["fast"], max_duration_s=60)
    first = RecordWriter(group_file(tmp_path, "records", "fast", "w1"))
    for i in range(3):
        first.write(_record("fast", i, 0.010))
    t_load = time.monotonic()
    progress.update("load", t_load=t_load, metrics=None)
    assert "3 requests finished" in progress.line() and "fast 3" in progress.line()
    second = RecordWriter(group_file(tmp_path, "records", "fast", "w2"))
    second.write(_record("fast", 3, 0.030))
    first.write(_record("fast", 4, 0.030))
    progress.update("load", t_load=t_load, metrics=None)
    assert "5 requests finished" in progress.line() and "fast 5 (TTFT p50 10 ms)" in progress.line()
    progress.stop()
    first.close()
    second.close()


def test_live_display_renders_and_stops(tmp_path):
    out = io.StringIO()
    console = Console(file=out, width=120, force_terminal=True)
    progress = RunProgress(console, live=True, poll_s=0)
    progress.start(scenario="s", run_dir=tmp_path, groups=["fast"], max_duration_s=60)
    writer = RecordWriter(group_file(tmp_path, "records", "fast", None))
    writer.write(_record("fast", 0, 0.042))
    progress.update("load", t_load=time.monotonic())
    progress.stop()
    progress.stop()  # twice is harmless
    text = out.getvalue()
    assert "phase" in text and "done" in text and "42.0" in text
    writer.close()
