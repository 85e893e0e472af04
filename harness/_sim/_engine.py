"""The emulator's engine: an asyncio step loop around the scheduler, and per-request outputs.

The loop runs one step at a time: ``Scheduler.schedule()``, sleep for the step's modelled
duration, ``Scheduler.complete()``, hand each request its new tokens. Outputs go to a
one-slot collector per request that merges new tokens while its consumer (the HTTP stream)
lags, as vLLM v1's ``RequestOutputCollector`` does (``vllm/v1/engine/output_processor.py``):
the engine never waits on a client. The only coupling to clients is the one asked for by
``kv_release="on_delivery"``: the HTTP layer calls ``detach`` once the response has left
the socket, and only then are a finished request's blocks released.

With ``engine_dir`` set, the engine writes its own tables there (``_recorder``): a row after
every step, a row per request when its KV blocks are freed for good, and the rest at ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

from harness._sim._config import SimConfig
from harness._sim._metrics import SimMetrics
from harness._sim._recorder import EngineRecorder
from harness._sim._scheduler import Scheduler, SimRequest


class RequestStream:
    """Output collector of one request: new token ids, merged until the consumer takes them.

    ``finish_reason`` is set (``stop``, ``length``) once generation ended; the consumer
    sees it with the last tokens.
    """

    __slots__ = ("request", "_tokens", "_finish_reason", "_waiter")

    def __init__(self, request: SimRequest) -> None:
        self.request = request
        self._tokens: list[int] = []
        self._finish_reason: str | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def request_id(self) -> str:
        """The engine's id of the request."""
        return self.request.request_id

    @property
    def num_pending(self) -> int:
        """Tokens generated but not yet taken by the consumer (it lags, e.g. blocked in send)."""
        return len(self._tokens)

    def put(self, token_id: int, finish_reason: str | None) -> None:
        """Append a new token (and the finish reason, if generation ended)."""
        self._tokens.append(token_id)
        if finish_reason is not None:
            self._finish_reason = finish_reason
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> tuple[list[int], str | None]:
        """Wait for new tokens or the end; return (token ids since last get, finish reason)."""
        while not self._tokens and self._finish_reason is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None
        tokens, self._tokens = self._tokens, []
        return tokens, self._finish_reason


class SimEngine:
    """Continuous batching in an asyncio task; see the module docstring.

    Create it anywhere; the step loop starts with the first ``submit`` (or ``start``) in
    the running event loop and stops with ``stop``. Times are ``time.monotonic()`` seconds
    (CLOCK_MONOTONIC, the clock of the client records; uvloop's ``loop.time()`` only has
    millisecond resolution).

    ``engine_dir``: the folder to write the engine tables into (None: none are written);
    ``engine_probe.json`` is written at once (``OSError`` if the folder is not writable).
    """

    def __init__(
        self, config: SimConfig, *, engine_dir: str | os.PathLike[str] | None = None
    ) -> None:
        self.config = config
        self.scheduler = Scheduler(config)
        self.metrics = SimMetrics(model_name=config.served_model_name)
        self.recorder = (
            EngineRecorder(
                engine_dir,
                kv_cache_blocks=config.num_blocks,
                kv_block_bytes=config.kv_block_bytes,
                kv_block_tokens=config.block_size,
            )  # fmt: skip
            if engine_dir is not None
            else None
        )
        self._streams: dict[str, RequestStream] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Start the step loop in the running event loop (idempotent)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sim-engine")

    async def stop(self) -> None:
        """Cancel the step loop and wait for it; finish the engine tables (``close_tables``)."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # Streams that the server has just cancelled (shutdown) detach in their next turn.
        await asyncio.sleep(0)
        self.close_tables()

    def close_tables(self) -> None:
        """Write the rows of the requests still alive and the tables' last parts (idempotent;
        call it with the step loop stopped)."""
        recorder = self.recorder
        if recorder is None or not recorder.active:
            return
        blocks = self.scheduler.blocks
        alive = [(r, len(blocks.blocks_of(r.request_id))) for r in self.scheduler.requests.values()]
        recorder.close(alive)

    @property
    def streams(self) -> dict[str, RequestStream]:
        """Output collectors of the requests the HTTP layer has not detached (a copy)."""
        return dict(self._streams)

    # -- requests -----------------------------------------------------------------------

    def submit(
        self,
        *,
        request_id: str,
        prompt_len: int,
        max_tokens: int,
        ignore_eos: bool,
        seed: int,
        min_tokens: int = 0,
        prompt_tokens: tuple[object, ...] = (),
    ) -> RequestStream:
        """Queue a request under the engine id ``request_id``; returns its output collector.

        ``prompt_len``, ``max_tokens`` and ``min_tokens`` (no EOS before that many, vLLM's
        sampling parameter) are in tokens; ``seed`` seeds its token draws; ``prompt_tokens``
        (``prompt_len`` of them, or empty: never cached) are what the prefix cache hashes.
        Raises ``ValueError`` if it cannot fit in ``max_model_len`` or its id is in use.
        """
        self.start()
        request = SimRequest(
            request_id=request_id,
            prompt_len=prompt_len,
            max_tokens=max_tokens,
            ignore_eos=ignore_eos,
            min_tokens=min_tokens,
            seed=seed,
            arrival_time=time.monotonic(),
            prompt_tokens=prompt_tokens,
        )
        self.scheduler.add_request(request)
        stream = RequestStream(request)
        self._streams[request.request_id] = stream
        self._update_gauges()
        self._kick()
        return stream

    def detach(self, request_id: str) -> None:
        """The HTTP layer is done with a request: abort it or release its held blocks.

        Called when the response has been delivered, the client went away, or the handler
        failed. A request still waiting or running is aborted (counted with finished_reason
        ``abort``); a request held for delivery releases its KV blocks; otherwise nothing.
        """
        self._streams.pop(request_id, None)
        sched = self.scheduler
        request = sched.requests.get(request_id)
        if request is None:
            return
        now = time.monotonic()
        if sched.abort(request_id, now):
            self.metrics.request_success["abort"].inc()
            self.metrics.e2e_request_latency.observe(now - request.arrival_time)
            freed = True
        else:
            freed = sched.release(request_id, now)
        if freed and self.recorder is not None:
            self.recorder.request(request)
            self.recorder.step(now, sched, None)
        self._update_gauges()
        self._kick()

    # -- the loop -----------------------------------------------------------------------

    def _kick(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _update_gauges(self) -> None:
        sched = self.scheduler
        m = self.metrics
        m.num_requests_running.set(sched.num_running)
        m.num_requests_waiting.set(sched.num_waiting)
        m.kv_cache_usage_perc.set(sched.blocks.usage)
        m.num_requests_held.set(sched.num_held)
        blocks = sched.blocks  # a prefix block two held requests share is one block
        m.kv_blocks_held.set(len({b for rid in sched.held for b in blocks.blocks_of(rid)}))

    async def _run(self) -> None:
        clock = time.monotonic
        sched = self.scheduler
        m = self.metrics
        wake = self._wake
        assert wake is not None
        streams = self._streams
        recorder = self.recorder
        while True:
            wake.clear()
            start = clock()
            step = sched.schedule(start)
            if step is None:
                self._update_gauges()
                await wake.wait()
                continue
            if step.num_preempted:
                m.num_preemptions.inc(step.num_preempted)
            if step.prefix_cache_queries:
                m.prefix_cache_queries.inc(step.prefix_cache_queries)
                m.prefix_cache_hits.inc(step.prefix_cache_hits)
            self._update_gauges()
            delay = start + step.duration_s - clock()
            await asyncio.sleep(delay if delay > 0 else 0)
            now = clock()
            outputs = sched.complete(step, now)
            generated = 0
            for out in outputs:
                request = out.request
                generated += 1
                if len(request.output_token_ids) == 1:
                    m.prompt_tokens.inc(request.prompt_len)
                    m.time_to_first_token.observe(now - request.arrival_time)
                    if request.admitted_time is not None:
                        m.request_queue_time.observe(request.admitted_time - request.arrival_time)
                elif out.inter_token_s is not None:
                    m.inter_token_latency.observe(out.inter_token_s)
                if out.finish_reason is not None:
                    m.request_success[out.finish_reason].inc()
                    m.e2e_request_latency.observe(now - request.arrival_time)
                    if recorder is not None and request.kv_freed_time is not None:
                        recorder.request(request)  # on_finish: freed in this step
                stream = streams.get(request.request_id)
                if stream is not None:
                    stream.put(out.token_id, out.finish_reason)
            m.generation_tokens.inc(generated)
            if recorder is not None:
                recorder.step(now, sched, step)
            self._update_gauges()
