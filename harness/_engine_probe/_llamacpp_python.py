"""llama-cpp-python's OpenAI server with the engine probe: ``python -m
harness._engine_probe._llamacpp_python`` takes the options of ``python -m llama_cpp.server``.

llama-cpp-python 0.3 (``llama_cpp/server/app.py``) serves one model with one context: a
streaming request takes the model lock (``get_llama_proxy``: ``llama_outer_lock`` then
``llama_inner_lock``) before its first token and keeps it until its stream ends. Its tokens are
generated in a worker thread and handed to the HTTP side through a 10-slot memory stream
(``anyio.create_memory_object_stream(10)`` in ``create_completion``), with no send timeout:
when the client stops reading, the socket's send buffer fills, then the memory stream, then
``send`` blocks, and no next token is asked for, while the lock, and so the whole engine, stays
with that request.

This module wraps three names of that app, without changing what they do, and records with
``time.monotonic()`` (CLOCK_MONOTONIC, the clock of the client records), into the folder named
by ``ZEROWINDOW_ENGINE_DIR`` (the run folder; unset, it records nothing):

- ``get_event_publisher`` (one streaming request): arrival, the ``X-Request-Id`` header, how it
  ended (``abort`` when the client left, ``interrupted`` when ``interrupt_requests`` cut it for
  a waiting request);
- ``get_llama_proxy`` (the model lock): when the request took it and gave it back;
- the send channel and the token iterator: each token generated, and each span of at least
  :data:`MIN_SEND_BLOCK_S` in which generation waited for ``send`` with the queue full (waits
  less than :data:`MERGE_GAP_S` apart are one span: a stream that drips through a nearly full
  send path; the columns ``send_blocked_at`` / ``send_unblocked_at``).

Per request it writes one row of ``engine_requests.parquet``: ``t_first_scheduled`` is the lock
taken, ``t_kv_freed`` the lock given back (the context free for the next request),
``kv_blocks_peak = kv_blocks_freed = 1`` of ``kv_cache_blocks = 1`` (a request holds the one
context whole). ``engine_steps.parquet`` gets a row at each lock change and each token: KV
usage 1 while a request holds the context, else 0; running 1 or 0; waiting: requests waiting
for the lock. The app also gains ``GET /health`` and ``GET /metrics`` (the same figures as
``llamacpp_python:*`` gauges and counters, Prometheus text format).

Needs llama-cpp-python with its server extra, pyarrow and prometheus_client in the engine's
interpreter; nothing else of the harness.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import llama_cpp
import prometheus_client
from llama_cpp.server import app as server_app
from starlette.responses import PlainTextResponse, Response

from harness._engine_probe._tables import (
    ENGINE_DIR_ENV,
    PROBE_ERROR,
    EngineTables,
    write_status,
)

ENGINE = "llama-cpp-python"
MIN_SEND_BLOCK_S = 0.05
"""A span of waiting for ``send`` shorter than this (s) is the ordinary hand-over between the
generating thread and the event loop, not a pause of generation: it is not recorded."""
MERGE_GAP_S = 0.02
"""Waits for ``send`` less than this (s) apart form one span: generation paced by delivery."""

_HOOKED = ("get_event_publisher", "get_llama_proxy", "create_app")
_missing = [name for name in _HOOKED if not callable(getattr(server_app, name, None))]
if _missing:
    raise ImportError(
        f"{PROBE_ERROR}: llama_cpp.server.app {llama_cpp.__version__} has no "
        f"{', '.join(_missing)}; this probe was written for llama-cpp-python 0.3"
    )


@dataclass
class _Life:
    """One streaming request inside the server; times in monotonic s, ``None`` until seen."""

    t_arrival: float
    header_id: str | None
    stream_id: str | None = None
    t_lock: float | None = None
    t_first_token: float | None = None
    t_last_token: float | None = None
    t_unlock: float | None = None
    tokens: int = 0
    finish_reason: str | None = None
    sent_done: bool = False
    blocked_at: list[float] = field(default_factory=list)
    unblocked_at: list[float] = field(default_factory=list)

    def blocked(self, t0: float, t1: float) -> None:
        """Generation waited for ``send`` from ``t0`` to ``t1``: a new span, or the last one
        extended when it ended less than :data:`MERGE_GAP_S` before (a stream that drips
        through a nearly full send path waits again after every token)."""
        if self.unblocked_at and t0 - self.unblocked_at[-1] < MERGE_GAP_S:
            self.unblocked_at[-1] = t1
        else:
            self.blocked_at.append(t0)
            self.unblocked_at.append(t1)

    def row(self) -> dict[str, Any]:
        held = self.t_lock is not None
        spans = [
            (a, b)
            for a, b in zip(self.blocked_at, self.unblocked_at, strict=True)
            if b - a >= MIN_SEND_BLOCK_S
        ]
        return {
            "engine_request_id": self.stream_id or f"cmpl-{self.header_id or id(self)}",
            "t_arrival": self.t_arrival,
            "t_first_scheduled": self.t_lock,
            "t_first_token": self.t_first_token,
            # cut short (the client left, or interrupted): generation ended when the engine
            # let the request go, as vLLM's abort; else at its last token
            "t_generation_end": self.t_unlock
            if self.finish_reason in ("abort", "interrupted", "error") or not self.t_last_token
            else self.t_last_token,
            "t_kv_freed": self.t_unlock,
            "finish_reason": self.finish_reason,
            "prompt_tokens": None,
            "output_tokens": self.tokens,
            "kv_blocks_peak": 1 if held else 0,
            "kv_blocks_freed": 1 if held else 0,
            "preempted_at": [],
            "resumed_at": [],
            "send_blocked_at": [a for a, _ in spans],
            "send_unblocked_at": [b for _, b in spans],
        }


class _Probe:
    """The recording state of the server process (one per process)."""

    def __init__(self) -> None:
        self.tables: EngineTables | None = None
        self.lock = threading.Lock()
        self.holding = 0
        self.waiting = 0
        self.registry = prometheus_client.CollectorRegistry()

        def gauge(name: str, doc: str) -> prometheus_client.Gauge:
            return prometheus_client.Gauge(f"llamacpp_python:{name}", doc, registry=self.registry)

        self.g_running = gauge("requests_running", "requests holding the model lock")
        self.g_waiting = gauge("requests_waiting", "requests waiting for the model lock")
        self.g_usage = gauge("context_usage_perc", "1 while a request holds the one context")
        self.g_blocked = gauge("requests_send_blocked", "requests whose generation waits")
        self.c_tokens = prometheus_client.Counter(
            "llamacpp_python:generation_tokens", "tokens generated", registry=self.registry
        )
        self.c_success = prometheus_client.Counter(
            "llamacpp_python:request_success",
            "streams ended",
            ["finished_reason"],
            registry=self.registry,
        )

    def start(self, out_dir: str, facts: dict[str, Any]) -> None:
        """Write ``engine_probe.json`` and start the tables in ``out_dir``. A table write that
        fails later stops the recording and says so there (``status = "failed"``); the server
        runs on."""

        def failed(exc: BaseException) -> None:
            self.tables = None
            reason = f"{PROBE_ERROR} failed: {type(exc).__name__}: {exc}"
            with contextlib.suppress(OSError):
                write_status(out_dir, **{**facts, "status": "failed", "reason": reason})

        write_status(out_dir, **facts)
        self.tables = EngineTables(out_dir, on_error=failed)
        atexit.register(self.tables.close)

    def step(self, *, tokens: int = 0, blocked_delta: int = 0) -> None:
        """Publish the state now (gauges) and record it as a step row."""
        with self.lock:
            self.g_running.set(self.holding)
            self.g_waiting.set(self.waiting)
            self.g_usage.set(1.0 if self.holding else 0.0)
            if blocked_delta:
                self.g_blocked.inc(blocked_delta)
            if tokens:
                self.c_tokens.inc(tokens)
            if self.tables is not None:
                self.tables.step(
                    time.monotonic(),
                    kv_cache_usage=1.0 if self.holding else 0.0,
                    running=self.holding,
                    waiting=self.waiting,
                    preemptions_total=0,
                    scheduled_tokens=tokens,
                )

    def done(self, life: _Life) -> None:
        self.c_success.labels(life.finish_reason or "unknown").inc()
        if self.tables is not None:
            self.tables.request(life.row())


PROBE = _Probe()
_current: contextvars.ContextVar[_Life | None] = contextvars.ContextVar("zw_life", default=None)
_original_publisher = server_app.get_event_publisher
_original_proxy = server_app.get_llama_proxy
_original_create_app = server_app.create_app


async def get_llama_proxy() -> AsyncIterator[Any]:
    """The app's ``get_llama_proxy``, stamping when the current request took the model lock
    and gave it back."""
    life = _current.get()
    if life is not None:
        with PROBE.lock:
            PROBE.waiting += 1
        PROBE.step()
    inner = _original_proxy()
    try:
        proxy = await inner.__anext__()
    finally:
        if life is not None:
            with PROBE.lock:
                PROBE.waiting -= 1
    if life is not None:
        life.t_lock = time.monotonic()
        with PROBE.lock:
            PROBE.holding += 1
        PROBE.step()
    try:
        yield proxy
    finally:
        await inner.aclose()  # the app's own code releases the locks
        if life is not None:
            life.t_unlock = time.monotonic()
            with PROBE.lock:
                PROBE.holding -= 1
            PROBE.step()


class _TimedSend:
    """The request's send channel, recording the spans in which ``send`` blocked."""

    def __init__(self, channel: Any, life: _Life) -> None:
        self._channel = channel
        self._life = life

    async def send(self, item: Any) -> None:
        if item.get("data") == "[DONE]":
            self._life.sent_done = True
        stats = self._channel.statistics()
        full = (
            stats.current_buffer_used >= stats.max_buffer_size and not stats.tasks_waiting_receive
        )
        if not full:
            await self._channel.send(item)
            return
        t0 = time.monotonic()
        PROBE.step(blocked_delta=1)
        try:
            await self._channel.send(item)
        finally:
            PROBE.step(blocked_delta=-1)
            self._life.blocked(t0, time.monotonic())

    async def __aenter__(self) -> _TimedSend:
        await self._channel.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        return await self._channel.__aexit__(*exc)


def _timed_call(llama_call: Callable[..., Any], life: _Life) -> Callable[..., Any]:
    """``llama_call`` whose token iterator stamps each token as it is generated."""

    def call(llama: Any, **kwargs: Any) -> Iterator[Any]:
        for chunk in llama_call(llama, **kwargs):
            now = time.monotonic()
            if life.t_first_token is None:
                life.t_first_token = now
                life.stream_id = chunk.get("id")
            choice = (chunk.get("choices") or [{}])[0]
            reason = choice.get("finish_reason")
            if reason:
                life.finish_reason = str(reason)
            text = choice.get("text") or (choice.get("delta") or {}).get("content")
            if text or not reason:  # the closing chunk carries no token
                life.t_last_token = now
                life.tokens += 1
                PROBE.step(tokens=1)
            yield chunk

    return call


async def get_event_publisher(
    request: Any,
    inner_send_chan: Any,
    body: Any,
    body_model: str | None,
    llama_call: Callable[..., Any],
    kwargs: dict[str, Any],
) -> None:
    """The app's ``get_event_publisher`` (one streaming request), recorded."""
    life = _Life(time.monotonic(), request.headers.get("x-request-id"))
    _current.set(life)
    try:
        await _original_publisher(
            request=request,
            inner_send_chan=cast(Any, _TimedSend(inner_send_chan, life)),  # duck-typed
            body=body,
            body_model=body_model,
            llama_call=_timed_call(llama_call, life),
            kwargs=kwargs,
        )
    except anyio.get_cancelled_exc_class():
        life.finish_reason = "interrupted" if life.sent_done else "abort"
        raise
    except Exception:
        life.finish_reason = "error"
        raise
    finally:
        if life.t_lock is not None and life.t_unlock is None:
            life.t_unlock = time.monotonic()
        PROBE.done(life)


def create_app(*args: Any, **kwargs: Any) -> Any:
    """The app's ``create_app``, plus ``GET /health`` and ``GET /metrics``, and the probe
    started when ``ZEROWINDOW_ENGINE_DIR`` names a folder."""
    app = _original_create_app(*args, **kwargs)

    @app.get("/health", include_in_schema=False)
    async def health() -> Response:
        return PlainTextResponse("ok")

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        return Response(
            prometheus_client.generate_latest(PROBE.registry),
            media_type=prometheus_client.CONTENT_TYPE_LATEST,
        )

    out_dir = os.environ.get(ENGINE_DIR_ENV)
    if out_dir and PROBE.tables is None:
        settings = next(server_app.get_server_settings())
        PROBE.start(
            out_dir,
            {
                "engine": ENGINE,
                "status": "running",
                "base_class": "llama_cpp.server.app",
                "engine_version": llama_cpp.__version__,
                "kv_cache_blocks": 1,
                "interrupt_requests": bool(getattr(settings, "interrupt_requests", False)),
            },
        )
    return app


def install() -> None:
    """Put the recorded names in place of the app's (module globals, looked up at call)."""
    server_app.get_event_publisher = get_event_publisher
    server_app.get_llama_proxy = get_llama_proxy
    server_app.create_app = create_app


def main() -> None:
    install()
    from llama_cpp.server import __main__ as server_main

    server_main.create_app = create_app  # imported by name there
    with contextlib.suppress(KeyboardInterrupt):
        server_main.main()
    if PROBE.tables is not None:
        PROBE.tables.close()


if __name__ == "__main__":
    main()
