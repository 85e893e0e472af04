"""The engine probe for vLLM: a scheduler that records every step and every request's KV life.

vLLM loads it through its own extension point, ``--scheduler-cls
harness._engine_probe._vllm_scheduler.EngineProbe`` (``SchedulerConfig.scheduler_cls``,
vllm/config/scheduler.py ``get_scheduler_cls``; the engine core builds it in
vllm/v1/engine/core.py). :class:`EngineProbe` builds a subclass of the class the engine would
have used without it: ``AsyncScheduler`` (vllm/v1/core/sched/async_scheduler.py) when the
resolved config has ``async_scheduling`` on, else ``Scheduler``
(vllm/v1/core/sched/scheduler.py), so that the probe does not switch async scheduling off.

What it records, with ``time.monotonic()`` (CLOCK_MONOTONIC, the clock of the client records),
into the folder named by ``ZEROWINDOW_ENGINE_DIR`` (the run folder; unset, it records nothing):

- after each ``update_from_output`` (one engine step): KV usage, KV blocks in use and blocks
  free but kept for reuse by the prefix cache (``_vllm_blocks.CachedFreeCounter``: counted
  incrementally, never by walking the pool), running, waiting, preemptions so far and tokens
  scheduled (``engine_steps.parquet``);
- per request (``engine_requests.parquet``): ``add_request`` (arrival), the first ``schedule``
  that gives it tokens (first scheduled, with the prompt tokens served from the prefix cache:
  ``Request.prefill_stats.num_cached_tokens``, local and KV-connector hits, which the scheduler
  sets at the request's first scheduling, vllm/v1/request.py and vllm/v1/metrics/stats.py
  ``PrefillStats``; ``Request.num_cached_tokens`` in vLLM versions before it) and each one
  after a preemption (resumed), the step whose output holds its first token,
  ``_preempt_request``, ``_free_request`` (generation end and finish reason: the engine stops
  generating for it) and ``_free_request_blocks`` with the request finished (its KV blocks go
  back to the pool; with a KV connector that delays the free, later than generation end).

A failure of the recording code never stops the engine: the probe writes ``engine_probe.json``
with ``status = "failed"`` and the reason, stops recording and lets the engine run on; the
harness then reports the run as scrape-only. A vLLM without the methods the probe hooks fails
to import this module with a message naming them.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import vllm
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from harness._engine_probe._tables import ENGINE_DIR_ENV, PROBE_ERROR, EngineTables, write_status
from harness._engine_probe._vllm_blocks import CachedFreeCounter

HOOKS = (
    "add_request",
    "schedule",
    "update_from_output",
    "_preempt_request",
    "_free_request",
    "_free_request_blocks",
    "shutdown",
)
"""The scheduler methods the probe extends; vLLM versions without one of them are refused."""

_missing = [f"{base.__name__}.{name}" for base in (Scheduler, AsyncScheduler)
            for name in HOOKS if not callable(getattr(base, name, None))]  # fmt: skip
if _missing:
    raise ImportError(
        f"{PROBE_ERROR}: vLLM {vllm.__version__} has no {', '.join(_missing)}; this probe "
        'was written for vLLM 0.32 (set the target\'s engine_probe = "off" or "fallback")'
    )


@dataclass
class _RequestLife:
    """What the probe knows of one request; times in monotonic s, ``None`` until they come."""

    request: Any
    t_arrival: float
    t_first_scheduled: float | None = None
    t_first_token: float | None = None
    t_generation_end: float | None = None
    finish_reason: str | None = None
    prompt_cached_tokens: int | None = None
    kv_blocks_peak: int = 0
    preempted_at: list[float] = field(default_factory=list)
    resumed_at: list[float] = field(default_factory=list)

    def row(self, t_kv_freed: float | None, kv_blocks_freed: int | None) -> dict[str, Any]:
        req = self.request
        return {
            "engine_request_id": req.request_id,
            "t_arrival": self.t_arrival,
            "t_first_scheduled": self.t_first_scheduled,
            "t_first_token": self.t_first_token,
            "t_generation_end": self.t_generation_end,
            "t_kv_freed": t_kv_freed,
            "finish_reason": self.finish_reason,
            "prompt_tokens": int(req.num_prompt_tokens),
            "prompt_cached_tokens": self.prompt_cached_tokens,
            "output_tokens": int(req.num_output_tokens),
            "kv_blocks_peak": self.kv_blocks_peak,
            "kv_blocks_freed": kv_blocks_freed,
            "preempted_at": self.preempted_at,
            "resumed_at": self.resumed_at,
        }


def _prompt_cached_tokens(request: Any) -> int | None:
    """Prompt tokens of ``request`` served from the prefix cache (local and KV connector) at its
    first scheduling; ``None`` where this vLLM does not say (see the module docstring)."""
    stats = getattr(request, "prefill_stats", None)
    n = getattr(stats, "num_cached_tokens", None) if stats is not None else None
    if n is None:
        n = getattr(request, "num_cached_tokens", None)
    return int(n) if isinstance(n, int) and n >= 0 else None


def _finish_reason(status: RequestStatus) -> str:
    reason = RequestStatus.get_finished_reason(status)
    return str(reason) if reason is not None else str(status).lower()


class _ProbeMixin:
    """The recording added to a vLLM scheduler class (see the module docstring)."""

    _zw_tables: EngineTables | None
    _zw_lives: dict[str, _RequestLife]
    _zw_preemptions: int
    _zw_lock: threading.Lock

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._zw_tables = None
        self._zw_lives = {}
        self._zw_unscheduled: set[str] = set()  # waiting for their first schedule or a resume
        self._zw_tokenless: set[str] = set()  # scheduled, no output token yet
        self._zw_preemptions = 0
        self._zw_cost_s = 0.0  # time the engine's thread spent in the probe's own code
        self._zw_lock = threading.Lock()
        self._zw_counter: CachedFreeCounter | None = None
        out_dir = os.environ.get(ENGINE_DIR_ENV)
        if not out_dir:
            return
        self._zw_dir = out_dir
        base = type(self).__mro__[2]
        self._zw_facts = {
            "engine": "vllm",
            "status": "running",
            "base_class": f"{base.__module__}.{base.__qualname__}",
            "engine_version": vllm.__version__,
            "kv_cache_blocks": self._zw_kv_cache_blocks(),
            "kv_block_bytes": self._zw_kv_block_bytes(),
            "kv_block_tokens": getattr(self, "block_size", None),  # Scheduler.block_size
        }
        try:
            write_status(out_dir, **self._zw_facts)
            self._zw_counter = CachedFreeCounter.attach(self.kv_cache_manager.block_pool)  # type: ignore[attr-defined]
            self._zw_tables = EngineTables(
                out_dir, on_error=self._zw_fail, on_flush=self._zw_report_cost
            )
        except Exception as exc:  # noqa: BLE001 - any failure: say so, never stop the engine
            self._zw_fail(exc)
            return
        atexit.register(self._zw_close)

    def _zw_kv_cache_blocks(self) -> int | None:
        """The blocks ``kv_cache_usage`` is a fraction of: the pool's, less its null block
        (``BlockPool.get_usage`` in vllm/v1/core/block_pool.py); None where vLLM lacks them."""
        try:
            return int(self.kv_cache_manager.block_pool.num_gpu_blocks) - 1  # type: ignore[attr-defined]
        except (AttributeError, TypeError, ValueError):
            return None

    def _zw_kv_block_bytes(self) -> int | None:
        """Bytes one KV block takes in the pool of one worker (one GPU; with tensor parallelism
        each rank holds a pool of this size). vLLM allocates the pool as one buffer of
        ``KVCacheTensor.size`` = bytes per block x ``num_blocks``, which every tensor of the
        scheduler's ``KVCacheConfig`` shares (``allocate_kv_cache`` in vllm/v1/worker/utils.py);
        the bytes per block are the ``page_size_bytes`` of a KV cache group's layers summed, the
        largest group's, aligned (``_get_kv_cache_bytes_per_block`` in
        vllm/v1/core/kv_cache_utils.py; a layer's page is ``block_size`` x KV heads x (K + V
        head size) x dtype bytes, ``AttentionSpec`` in vllm/v1/kv_cache_interface.py). ``None``
        where vLLM lays its pool out otherwise (older versions gave each tensor an allocation of
        its own, without ``block_stride``) or its device tensors do not share one size
        (host-resident tensors, HiSparse's host pool, are no accelerator memory: left out)."""
        try:
            config = self.kv_cache_config  # type: ignore[attr-defined]
            tensors = [t for t in config.kv_cache_tensors if not getattr(t, "host_resident", 0)]
            shared = all(hasattr(t, "block_stride") for t in tensors)
            sizes = {int(t.size) for t in tensors}
            blocks = int(config.num_blocks)
        except (AttributeError, TypeError, ValueError):
            return None
        return sizes.pop() // blocks if shared and len(sizes) == 1 and blocks > 0 else None

    # -- failure, cost and end ------------------------------------------------------------

    def _zw_fail(self, exc: BaseException) -> None:
        """Stop recording and say why in ``engine_probe.json``; the engine runs on."""
        tables, self._zw_tables = self._zw_tables, None
        if tables is not None:
            tables.close_quietly()
        reason = f"{PROBE_ERROR} failed: {type(exc).__name__}: {exc}"
        try:
            write_status(self._zw_dir, **{**self._zw_facts, "status": "failed", "reason": reason})
        except OSError:
            pass

    def _zw_report_cost(self, tables: EngineTables) -> None:
        """After each flush: ``engine_probe.json`` gains the probe's cost so far (seconds of
        the engine thread in the probe's code, seconds of the flushing thread, steps)."""
        write_status(
            self._zw_dir,
            **self._zw_facts,
            cost={
                "engine_thread_s": round(self._zw_cost_s, 6),
                "flush_thread_s": round(tables.flush_s, 6),
                "steps": tables.steps_recorded,
            },
        )

    def _zw_close(self) -> None:
        with self._zw_lock:
            tables, self._zw_tables = self._zw_tables, None
            if tables is None:
                return
            try:
                for life in self._zw_lives.values():  # alive when the engine stopped
                    tables.request(life.row(None, None))
                self._zw_lives.clear()
                tables.close()  # its last flush reports the cost
            except Exception as exc:  # noqa: BLE001
                self._zw_fail(exc)

    def shutdown(self) -> None:
        super().shutdown()  # type: ignore[misc]
        self._zw_close()

    # -- hooks ----------------------------------------------------------------------------

    def add_request(self, request: Any) -> None:
        super().add_request(request)  # type: ignore[misc]
        req_id = request.request_id
        if self._zw_tables is not None and req_id not in self._zw_lives:
            t0 = time.perf_counter()
            self._zw_lives[req_id] = _RequestLife(request, time.monotonic())
            self._zw_unscheduled.add(req_id)
            self._zw_tokenless.add(req_id)
            self._zw_cost_s += time.perf_counter() - t0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        if self._zw_tables is not None and self._zw_unscheduled:
            t0 = time.perf_counter()
            try:
                now = time.monotonic()
                for req_id in self._zw_unscheduled.intersection(output.num_scheduled_tokens):
                    self._zw_unscheduled.discard(req_id)
                    life = self._zw_lives.get(req_id)
                    if life is None:
                        continue
                    if life.t_first_scheduled is None:
                        life.t_first_scheduled = now
                        life.prompt_cached_tokens = _prompt_cached_tokens(life.request)
                    else:
                        life.resumed_at.append(now)
            except Exception as exc:  # noqa: BLE001
                self._zw_fail(exc)
            self._zw_cost_s += time.perf_counter() - t0
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        tables = self._zw_tables
        if tables is None:
            return outputs
        t0 = time.perf_counter()
        try:
            now = time.monotonic()
            if self._zw_tokenless:
                for req_id in self._zw_tokenless.intersection(
                    scheduler_output.num_scheduled_tokens
                ):
                    life = self._zw_lives.get(req_id)
                    if life is None:
                        self._zw_tokenless.discard(req_id)
                    elif life.request.num_output_tokens > 0:
                        life.t_first_token = now
                        self._zw_tokenless.discard(req_id)
            running, waiting = self.get_request_counts()  # type: ignore[attr-defined]
            counter = self._zw_counter
            tables.step(
                now,
                kv_cache_usage=float(self.kv_cache_manager.usage),  # type: ignore[attr-defined]
                running=running,
                waiting=waiting,
                preemptions_total=self._zw_preemptions,
                scheduled_tokens=int(scheduler_output.total_num_scheduled_tokens),
                kv_blocks_in_use=None if counter is None else counter.in_use,
                kv_blocks_cached_free=None if counter is None else counter.count,
            )
        except Exception as exc:  # noqa: BLE001
            self._zw_fail(exc)
        self._zw_cost_s += time.perf_counter() - t0
        return outputs

    def _preempt_request(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super()._preempt_request(request, *args, **kwargs)  # type: ignore[misc]
        self._zw_preemptions += 1
        life = self._zw_lives.get(request.request_id)
        if life is not None:
            life.preempted_at.append(time.monotonic())
            self._zw_unscheduled.add(request.request_id)

    def _free_request(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        life = self._zw_lives.get(request.request_id)
        if life is not None and life.t_generation_end is None:
            life.t_generation_end = time.monotonic()
            life.finish_reason = _finish_reason(request.status)
        return super()._free_request(request, *args, **kwargs)  # type: ignore[misc]

    def _free_request_blocks(self, request: Any) -> None:
        life = self._zw_lives.get(request.request_id)
        blocks = 0
        if life is not None:
            try:
                blocks = self._zw_blocks(request.request_id)
                life.kv_blocks_peak = max(life.kv_blocks_peak, blocks)
            except Exception as exc:  # noqa: BLE001
                self._zw_fail(exc)
        super()._free_request_blocks(request)  # type: ignore[misc]
        if life is None or not request.is_finished():
            return  # a preemption: the blocks come back, the request lives on
        del self._zw_lives[request.request_id]
        self._zw_unscheduled.discard(request.request_id)
        self._zw_tokenless.discard(request.request_id)
        tables = self._zw_tables
        if tables is not None:
            try:
                tables.request(life.row(time.monotonic(), blocks))
            except Exception as exc:  # noqa: BLE001
                self._zw_fail(exc)

    def _zw_blocks(self, request_id: str) -> int:
        """KV blocks the request holds, over all KV cache groups."""
        groups = self.kv_cache_manager.get_block_ids(request_id)  # type: ignore[attr-defined]
        return sum(len(ids) for ids in groups)


class ProbeScheduler(_ProbeMixin, Scheduler):
    """vLLM's ``Scheduler`` with the probe."""


class ProbeAsyncScheduler(_ProbeMixin, AsyncScheduler):
    """vLLM's ``AsyncScheduler`` with the probe."""


class EngineProbe:
    """What ``--scheduler-cls`` names: constructing it builds :class:`ProbeAsyncScheduler` when
    the engine's resolved config has async scheduling on, else :class:`ProbeScheduler` (vLLM
    passes ``vllm_config`` by keyword, vllm/v1/engine/core.py)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:  # noqa: D102
        config = kwargs.get("vllm_config", args[0] if args else None)
        use_async = bool(getattr(getattr(config, "scheduler_config", None),
                                 "async_scheduling", False))  # fmt: skip
        return (ProbeAsyncScheduler if use_async else ProbeScheduler)(*args, **kwargs)
