"""The emulator writes the engine's own tables (``engine_steps``, ``engine_requests``,
``engine_probe.json``), as vLLM does through the engine probe: same ids, same clock, and with
``on_delivery`` a KV free that waits for the stream to be delivered.

Real sockets on loopback; stalled clients never read (``tests.test_sim_helpers``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from harness._engine_probe import ENGINE_DIR_ENV, REQUESTS_FILE, STATUS_FILE, STEPS_FILE
from harness._sim import SimConfig, SimServer
from harness._sim.__main__ import build_parser
from harness._sim.__main__ import main as sim_main
from harness._sim._config import KvRelease
from harness._sim._engine import SimEngine
from harness._sim._protocol import GenerationParams, engine_request_id, stream_id
from harness._sim._scheduler import Scheduler, SimRequest
from harness.servers._sim import SimTarget, SimTargetConfig
from tests.test_sim_helpers import (
    CLIENT,
    fast_sim_config,
    generation_over,
    scrape,
    sse_events,
    stalled_client,
    wait_for,
)

MAX_TOKENS = 2000
FAST_TOKENS = 50
HOLD_S = 1.0


def _config(kv_release: KvRelease, **kw: Any) -> SimConfig:
    # a stalled stream cannot be delivered: far more than the buffers hold
    return fast_sim_config(kv_release, **{"sndbuf_bytes": 16384, **kw})


def _tables(out: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(step rows, request rows) as the analysis reads them (a file or a folder of parts)."""
    steps = pq.read_table(out / STEPS_FILE).to_pylist()
    requests = pq.read_table(out / REQUESTS_FILE).to_pylist()
    return steps, requests


def _read_stream(url: str, *, x_request_id: str, chat: bool = False) -> str:
    """Read one whole stream of ``FAST_TOKENS`` tokens; the ``id`` of its chunks."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"max_tokens": FAST_TOKENS, "ignore_eos": True, "stream": True}
    if chat:
        body["messages"] = [{"role": "user", "content": "hi there"}]
    else:
        body["prompt"] = "one two three"
    headers = {"X-Request-Id": x_request_id}
    with CLIENT.stream("POST", url + path, json=body, headers=headers) as r:
        assert r.status_code == 200
        events = sse_events(r.read().decode())
    assert events[-1] == "[DONE]"
    ids = {json.loads(e)["id"] for e in events[:-1]}
    assert len(ids) == 1
    return ids.pop()


def _check_steps(steps: list[dict[str, Any]], t0: float, t1: float) -> None:
    assert steps, "no step rows"
    assert [s["step"] for s in steps] == list(range(len(steps)))
    times = [s["t"] for s in steps]
    assert times == sorted(times) and t0 <= times[0] and times[-1] <= t1  # CLOCK_MONOTONIC
    assert all(0.0 <= s["kv_cache_usage"] <= 1.0 for s in steps)
    assert max(s["kv_cache_usage"] for s in steps) > 0.2  # the stalled request: 63 of 256


def _check_times(row: dict[str, Any], t0: float, t1: float) -> None:
    order = ["t_arrival", "t_first_scheduled", "t_first_token", "t_generation_end", "t_kv_freed"]
    times = [row[k] for k in order]
    assert None not in times, row
    assert t0 <= times[0] and times == sorted(times) and times[-1] <= t1, row


# -- ids ----------------------------------------------------------------------------------


def _params(chat: bool, request_id: str | None = None) -> GenerationParams:
    return GenerationParams(
        chat=chat, prompt_len=3, max_tokens=4, ignore_eos=True, stream=True,
        include_usage=False, continuous_usage=False, seed=0, request_id=request_id,
    )  # fmt: skip


def test_ids_like_vllm() -> None:
    assert stream_id(_params(False), "abc") == "cmpl-abc"
    assert stream_id(_params(True, "body"), "abc") == "chatcmpl-abc"  # the header wins
    assert stream_id(_params(False, "body"), None) == "cmpl-body"
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}", stream_id(_params(False), None))
    assert re.fullmatch(r"chatcmpl-[0-9a-f]{16}", stream_id(_params(True), None))
    assert re.fullmatch(r"cmpl-abc-0-[0-9a-f]{8}", engine_request_id("cmpl-abc", chat=False))
    assert re.fullmatch(r"chatcmpl-abc-[0-9a-f]{8}", engine_request_id("chatcmpl-abc", chat=True))


# -- the scheduler's record, with a fake clock ---------------------------------------------


def test_scheduler_records_preemption_resumption_and_frees() -> None:
    cfg = SimConfig(block_size=4, num_blocks=6, max_num_seqs=4, max_model_len=24,
                    step_fixed_ms=1.0)  # fmt: skip
    s = Scheduler(cfg)
    a = SimRequest("a", prompt_len=4, max_tokens=16, ignore_eos=True)
    b = SimRequest("b", prompt_len=4, max_tokens=16, ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    now = 0.0
    while a.finish_reason is None or b.finish_reason is None:
        step = s.schedule(now)
        assert step is not None
        now += 1.0
        s.complete(step, now)
    # 6 blocks cannot hold two requests of 20 slots: b (admitted last) was preempted.
    assert b.preempted_times and len(b.resumed_times) == len(b.preempted_times)
    assert all(p < r for p, r in zip(b.preempted_times, b.resumed_times, strict=True))
    assert b.admitted_time == 0.0 and not a.preempted_times
    for r in (a, b):  # on_finish: freed in the step that sampled the last token
        assert r.kv_freed_time == r.finished_time is not None
        assert r.kv_blocks_freed == r.kv_blocks_peak == 5  # 4 + 15 computed slots

    held = Scheduler(cfg.model_copy(update={"kv_release": "on_delivery"}))
    h = SimRequest("h", prompt_len=4, max_tokens=2, ignore_eos=True)
    held.add_request(h)
    while h.finish_reason is None:
        step = held.schedule(now)
        assert step is not None
        now += 1.0
        held.complete(step, now)
    assert h.kv_freed_time is None and h.kv_blocks_freed is None  # held for delivery
    assert held.release("h", now + 5.0) and h.kv_freed_time == now + 5.0
    assert h.kv_blocks_freed == h.kv_blocks_peak == 2  # 4 + 1 computed slots

    c = SimRequest("c", prompt_len=4, max_tokens=4)
    held.add_request(c)
    assert held.abort("c", 42.0)  # never scheduled
    assert c.kv_freed_time == c.finished_time == 42.0 and c.kv_blocks_freed == 0


# -- the engine alone ----------------------------------------------------------------------


def test_requests_alive_at_stop_are_written_with_what_is_known(tmp_path: Path) -> None:
    async def run() -> None:
        engine = SimEngine(_config("on_delivery", step_fixed_ms=1.0), engine_dir=tmp_path)
        stream = engine.submit(request_id="cmpl-x-0-00000000", prompt_len=40, max_tokens=500,
                               ignore_eos=True, seed=0)  # fmt: skip
        tokens = 0
        while tokens < 5:
            new, _ = await stream.get()
            tokens += len(new)
        await engine.stop()
        engine.close_tables()  # idempotent

    asyncio.run(run())
    steps, (row,) = _tables(tmp_path)
    assert len(steps) >= 5 and steps[-1]["kv_cache_usage"] > 0
    assert row["engine_request_id"] == "cmpl-x-0-00000000"
    assert row["finish_reason"] is None and row["t_generation_end"] is None
    assert row["t_kv_freed"] is None and row["kv_blocks_freed"] is None
    assert row["t_first_token"] is not None and row["output_tokens"] >= 5
    assert row["kv_blocks_peak"] == 2  # 40 prompt + a few outputs in blocks of 32


# -- in-process server ----------------------------------------------------------------------


def test_on_delivery_frees_kv_when_the_stalled_client_leaves(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with SimServer(_config("on_delivery"), engine_dir=tmp_path) as srv:
        status = json.loads((tmp_path / STATUS_FILE).read_text())
        assert status["engine"] == "emulator" and status["status"] == "running"
        assert status["base_class"] is None and isinstance(status["pid"], int)
        client = stalled_client(srv.port, max_tokens=MAX_TOKENS)
        try:
            fast_id = _read_stream(srv.url, x_request_id="fast-1")
            wait_for(lambda: generation_over(srv.url, MAX_TOKENS + FAST_TOKENS),
                     timeout_s=30, what="generation to end")  # fmt: skip
            time.sleep(HOLD_S)  # generation is over; the stalled stream holds its KV
        finally:
            client.close()
        wait_for(lambda: scrape(srv.url)["vllm:kv_cache_usage_perc"] == 0,
                 timeout_s=10, what="KV to be freed")  # fmt: skip
    t1 = time.monotonic()
    steps, requests = _tables(tmp_path)
    _check_steps(steps, t0, t1)
    assert len(requests) == 2
    by_id = {r["engine_request_id"]: r for r in requests}
    assert fast_id == "cmpl-fast-1"
    (fast_key,) = [k for k in by_id if k.startswith(fast_id + "-")]
    assert re.fullmatch(r"cmpl-fast-1-0-[0-9a-f]{8}", fast_key)
    fast = by_id.pop(fast_key)
    (stalled,) = by_id.values()
    assert re.fullmatch(r"cmpl-[0-9a-f]{16}-0-[0-9a-f]{8}", stalled["engine_request_id"])
    for row in (fast, stalled):
        _check_times(row, t0, t1)
        assert row["finish_reason"] == "length"
        assert row["preempted_at"] == [] and row["resumed_at"] == []
        assert row["kv_blocks_freed"] == row["kv_blocks_peak"] > 0
    assert stalled["output_tokens"] == MAX_TOKENS and stalled["prompt_tokens"] == 1
    assert stalled["kv_blocks_peak"] == 63  # 1 + 1999 computed slots in blocks of 32
    assert fast["output_tokens"] == FAST_TOKENS and fast["prompt_tokens"] == 3
    # KV held after generation: the stalled stream until it left, the fast one hardly.
    assert stalled["t_kv_freed"] - stalled["t_generation_end"] > HOLD_S * 0.8
    assert fast["t_kv_freed"] - fast["t_generation_end"] < 0.5
    # Tokens computed: each prompt once, then one per step for each output but the last.
    computed = sum(r["prompt_tokens"] + r["output_tokens"] - 1 for r in requests)
    assert sum(s["num_scheduled_tokens"] for s in steps) == computed
    assert steps[-1]["num_requests_running"] == 0 and steps[-1]["num_preemptions_total"] == 0
    # The free on delivery, between steps, has its own row: KV back at 0.
    assert steps[-1]["kv_cache_usage"] == 0 and steps[-1]["num_scheduled_tokens"] == 0


def test_on_finish_frees_kv_in_the_last_step(tmp_path: Path) -> None:
    t0 = time.monotonic()
    with SimServer(_config("on_finish"), engine_dir=tmp_path) as srv:
        client = stalled_client(srv.port, max_tokens=MAX_TOKENS)
        try:
            _read_stream(srv.url, x_request_id="chat-1", chat=True)
            wait_for(lambda: generation_over(srv.url, MAX_TOKENS + FAST_TOKENS),
                     timeout_s=30, what="generation to end")  # fmt: skip
        finally:
            client.close()
    t1 = time.monotonic()
    steps, requests = _tables(tmp_path)
    _check_steps(steps, t0, t1)
    assert steps[-1]["kv_cache_usage"] == 0.0
    assert len(requests) == 2
    ids = sorted(r["engine_request_id"] for r in requests)
    assert re.fullmatch(r"chatcmpl-chat-1-[0-9a-f]{8}", ids[0])
    for row in requests:
        _check_times(row, t0, t1)
        assert row["finish_reason"] == "length"
        assert abs(row["t_kv_freed"] - row["t_generation_end"]) < 1e-3
        assert row["kv_blocks_freed"] == row["kv_blocks_peak"] > 0


@pytest.mark.parametrize("kv_release", ["on_finish", "on_delivery"])
def test_a_client_that_leaves_mid_generation_is_aborted(
    tmp_path: Path, kv_release: KvRelease
) -> None:
    with SimServer(_config(kv_release, step_fixed_ms=3.0), engine_dir=tmp_path) as srv:
        client = stalled_client(srv.port, max_tokens=MAX_TOKENS)  # 2000 steps: 6 s or more
        wait_for(lambda: scrape(srv.url)["vllm:generation_tokens_total"] > 10,
                 timeout_s=10, what="generation to start")  # fmt: skip
        left = time.monotonic()
        client.close()
        wait_for(lambda: scrape(srv.url)["vllm:kv_cache_usage_perc"] == 0,
                 timeout_s=10, what="the request to be aborted")  # fmt: skip
    _, (row,) = _tables(tmp_path)
    assert row["finish_reason"] == "abort"
    assert 10 <= row["output_tokens"] < MAX_TOKENS
    assert row["t_generation_end"] == row["t_kv_freed"]
    assert left <= row["t_kv_freed"] < left + 5.0
    assert row["kv_blocks_freed"] == row["kv_blocks_peak"] > 0


# -- as a process ----------------------------------------------------------------------------


def _port_from_log(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    lines = []
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        lines.append(line)
        found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return int(found.group(1))
    raise AssertionError("".join(lines))


def test_tables_are_complete_after_sigterm(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "harness._sim", "--port", "0", "--kv-release", "on_delivery",
            "--step-fixed-ms", "0.2", "--num-blocks", "128", "--sndbuf-bytes", "16384"]  # fmt: skip
    env = {**os.environ, ENGINE_DIR_ENV: str(tmp_path)}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    client = None
    try:
        url = f"http://127.0.0.1:{_port_from_log(proc)}"
        status = json.loads((tmp_path / STATUS_FILE).read_text())
        assert status["engine"] == "emulator" and status["pid"] == proc.pid
        assert _read_stream(url, x_request_id="c7", chat=True) == "chatcmpl-c7"
        client = stalled_client(int(url.rsplit(":", 1)[1]), max_tokens=1000)
        wait_for(lambda: generation_over(url, 1000 + FAST_TOKENS)
                 and scrape(url)["sim:num_requests_held_for_delivery"] == 1,
                 timeout_s=20, what="the stalled request to be held")  # fmt: skip
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if client is not None:
            client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    steps, requests = _tables(tmp_path)
    assert steps and max(s["kv_cache_usage"] for s in steps) > 0
    assert len(requests) == 2
    by_reason = {r["engine_request_id"].startswith("chatcmpl-c7-"): r for r in requests}
    chat, stalled = by_reason[True], by_reason[False]
    assert re.fullmatch(r"chatcmpl-c7-[0-9a-f]{8}", chat["engine_request_id"])
    assert chat["t_kv_freed"] is not None and chat["t_kv_freed"] < stopped
    assert stalled["finish_reason"] == "length" and stalled["output_tokens"] == 1000
    assert stalled["t_generation_end"] < stopped
    # Held until the shutdown's grace (2 s) ran out and its stream was cancelled.
    assert stalled["t_kv_freed"] is not None
    assert stopped + 1.0 < stalled["t_kv_freed"] < stopped + 10.0


def test_a_launched_sim_target_writes_into_the_run_folder(tmp_path: Path) -> None:
    target = SimTarget(SimTargetConfig(engine=SimConfig(step_fixed_ms=0.5)))
    try:
        target.start(tmp_path)
        _read_stream(target.base_url, x_request_id="launched")
    finally:
        target.stop()
    status = json.loads((tmp_path / STATUS_FILE).read_text())
    assert target.server.proc is not None
    assert status["engine"] == "emulator" and status["pid"] == target.server.proc.pid
    _, (row,) = _tables(tmp_path)
    assert row["engine_request_id"].startswith("cmpl-launched-0-")
    assert row["output_tokens"] == FAST_TOKENS


def test_engine_dir_option(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--engine-dir", str(tmp_path)])
    assert args.engine_dir == str(tmp_path)
    assert build_parser().parse_args([]).engine_dir is None  # then $ZEROWINDOW_ENGINE_DIR
    missing = tmp_path / "missing"
    assert sim_main(["--port", "0", "--engine-dir", str(missing)]) == 2
    assert not missing.exists()


def test_a_reader_asking_for_a_flush_gets_it_at_once(tmp_path: Path) -> None:
    """A running engine flushes every interval, and at once when the harness asks (the end of a
    run against a shared engine): rows up to the moment asked are on disk within a poll or two."""
    from harness._engine_probe import FLUSH_REQUEST_FILE, EngineTables
    from harness.collectors._engine_tables import wait_flushed

    tables = EngineTables(tmp_path, flush_interval_s=60.0)
    try:
        kv = {"kv_cache_usage": 0.5, "running": 1, "waiting": 0}
        tables.step(time.monotonic(), **kv, preemptions_total=0, scheduled_tokens=1)
        t_end = time.monotonic()
        waited = wait_flushed(tmp_path, t_end, timeout_s=10.0)
        assert waited < 2.0, waited  # not the 60 s interval
        assert not (tmp_path / FLUSH_REQUEST_FILE).exists()  # the engine took the request
        steps = pq.read_table(tmp_path / STEPS_FILE).to_pandas()
        assert len(steps) == 1 and steps["t"].iloc[0] <= t_end
    finally:
        tables.close()
