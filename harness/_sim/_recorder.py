"""The emulator's engine tables: ``engine_steps.parquet``, ``engine_requests.parquet`` and
``engine_probe.json``, the same files vLLM writes through the engine probe
(``harness._engine_probe``; columns in ``docs/run-folder.md``).

The engine (``_engine.SimEngine``) calls :meth:`EngineRecorder.step` after every completed
step and :meth:`EngineRecorder.request` when a request's KV blocks went back to the pool for
good: at its last token (``on_finish``), when its response was delivered or its client left
(``on_delivery``), or when it was aborted. :meth:`EngineRecorder.close` writes a row for each
request still alive with what is known then (``t_kv_freed``, ``kv_blocks_freed`` null; the
finish reason null if it was still generating) and the last parts of the tables.

Times are the scheduler's, ``time.monotonic()`` seconds (CLOCK_MONOTONIC on Linux, the clock
of the client records). ``engine_probe.json`` says ``engine = "emulator"`` and
``base_class = null`` (no vLLM scheduler class is extended). As in the vLLM probe, a failure
to write after the start stops the recording (``status = "failed"`` with the reason) and
never the engine.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
from collections.abc import Iterable
from typing import Any

from harness._engine_probe import EngineTables, write_status
from harness._sim._scheduler import ScheduledStep, Scheduler, SimRequest

logger = logging.getLogger("harness.sim")

ENGINE = "emulator"


def _version() -> str | None:
    try:
        return importlib.metadata.version("zerowindow")
    except importlib.metadata.PackageNotFoundError:
        return None


def request_row(request: SimRequest, *, blocks_held: int = 0) -> dict[str, Any]:
    """The ``engine_requests.parquet`` row of ``request`` (times in monotonic s, counts in
    tokens and blocks); ``blocks_held`` is what it holds now if its blocks were not freed
    for good yet (for its ``kv_blocks_peak``)."""
    return {
        "engine_request_id": request.request_id,
        "t_arrival": request.arrival_time,
        "t_first_scheduled": request.admitted_time,
        "t_first_token": request.first_token_time,
        "t_generation_end": request.finished_time,
        "t_kv_freed": request.kv_freed_time,
        "finish_reason": request.finish_reason,
        "prompt_tokens": request.prompt_len,
        "prompt_cached_tokens": request.prompt_cached_tokens,
        "output_tokens": len(request.output_token_ids),
        "kv_blocks_peak": max(request.kv_blocks_peak, blocks_held),
        "kv_blocks_freed": request.kv_blocks_freed,
        "preempted_at": list(request.preempted_times),
        "resumed_at": list(request.resumed_times),
    }


class EngineRecorder:
    """Writes one emulator's engine tables into ``out_dir`` (the run folder).

    Creating it writes ``engine_probe.json`` (``status = "running"``, the pool's
    ``kv_cache_blocks``, the bytes each block stands for, ``kv_block_bytes``, and the tokens
    it holds, ``kv_block_tokens``); raises ``OSError`` if ``out_dir`` is not a writable folder.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        kv_cache_blocks: int | None = None,
        kv_block_bytes: int | None = None,
        kv_block_tokens: int | None = None,
    ) -> None:
        self.out_dir = out_dir
        self._version = _version()
        write_status(out_dir, engine=ENGINE, status="running", base_class=None,
                     engine_version=self._version, kv_cache_blocks=kv_cache_blocks,
                     kv_block_bytes=kv_block_bytes, kv_block_tokens=kv_block_tokens)  # fmt: skip
        self._tables: EngineTables | None = EngineTables(out_dir)

    @property
    def active(self) -> bool:
        """Whether rows are still being recorded (not closed, no failure)."""
        return self._tables is not None

    def step(self, now: float, sched: Scheduler, step: ScheduledStep | None) -> None:
        """The row of ``step``, completed at ``now`` (monotonic s): the scheduler's state
        after ``complete`` (KV usage 0..1, KV blocks in use and cached-free, requests running
        and waiting, preemptions so far) and the tokens the step computed (prefill + one per
        decoding sequence). ``None``: the state after KV was freed between steps (0 tokens),
        so that the steps' KV usage falls when held blocks are released on delivery."""
        tables = self._tables
        if tables is None:
            return
        blocks = sched.blocks
        try:
            tables.step(
                now,
                kv_cache_usage=blocks.usage,
                kv_blocks_in_use=blocks.num_used_blocks,
                kv_blocks_cached_free=blocks.num_cached_free_blocks,
                running=sched.num_running,
                waiting=sched.num_waiting,
                preemptions_total=sched.num_preemptions_total,
                scheduled_tokens=0
                if step is None
                else step.num_prefill_tokens + step.num_decode_seqs,
            )
        except Exception as exc:  # noqa: BLE001 - recording never stops the engine
            self._fail(exc)

    def request(self, request: SimRequest, *, blocks_held: int = 0) -> None:
        """The row of ``request`` (see :func:`request_row`)."""
        tables = self._tables
        if tables is None:
            return
        try:
            tables.request(request_row(request, blocks_held=blocks_held))
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def close(self, alive: Iterable[tuple[SimRequest, int]] = ()) -> None:
        """Write a row for each ``(request, blocks it holds)`` still alive and finish the
        tables (their last parts); a second call does nothing."""
        tables, self._tables = self._tables, None
        if tables is None:
            return
        try:
            for request, blocks_held in alive:
                tables.request(request_row(request, blocks_held=blocks_held))
            tables.close()
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        self._tables = None
        reason = f"zerowindow emulator engine tables failed: {type(exc).__name__}: {exc}"
        logger.error("%s", reason)
        try:
            write_status(self.out_dir, engine=ENGINE, status="failed", reason=reason,
                         base_class=None, engine_version=self._version)  # fmt: skip
        except OSError:
            pass
