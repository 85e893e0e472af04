"""The emulator's HTTP front end: a Starlette app with vLLM's OpenAI-compatible routes.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (SSE when ``stream`` is
true, JSON otherwise), ``GET /v1/models``, ``GET /health``, ``GET /metrics``.

Streams are Starlette ``StreamingResponse`` objects written through uvicorn, as in vLLM
(``vllm/entrypoints/openai/completion/api_router.py``), so the ASGI ``send`` of a chunk
awaits when uvicorn's flow control has paused writing (transport write buffer above its
high-water mark because the client's receive window is closed). A client that disconnects
aborts its request (finished_reason ``abort``), as vLLM's ``with_cancellation`` does.

``kv_release="on_delivery"``: after the last event (``data: [DONE]``) has been handed to
uvicorn, the response waits until the transport's write buffer and the kernel Send-Q are
empty (``_delivery.DeliveryProbe``), or the client is gone, and only then lets the engine
release the request's KV blocks. This needs the asyncio transport of the connection, which
the app takes from uvicorn's ``send`` (``_delivery.transport_from_send``); under another
ASGI server the blocks are released when the last event has been handed over.

Ids are vLLM's: the response's ``id`` is ``cmpl-`` (``chatcmpl-``) and the ``X-Request-Id``
header (else the body's ``request_id``, else 16 random hex digits); the engine's id of the
request begins with it (``_protocol.stream_id``, ``_protocol.engine_request_id``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
from collections.abc import AsyncIterator
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from harness._sim._config import SimConfig
from harness._sim._delivery import TRANSPORT_SCOPE_KEY, DeliveryProbe, transport_from_send
from harness._sim._engine import RequestStream, SimEngine
from harness._sim._metrics import CONTENT_TYPE
from harness._sim._protocol import (
    DONE,
    Renderer,
    RequestError,
    engine_request_id,
    models_body,
    parse_request,
    stream_id,
    token_text,
)

logger = logging.getLogger("harness.sim")


class SimApp(Starlette):
    """Starlette app that records each connection's transport in the ASGI scope.

    ``engine`` is the ``SimEngine`` serving the routes. The transport is taken from the
    ``send`` callable uvicorn passes in (before Starlette's middleware wraps it) and stored
    under ``_delivery.TRANSPORT_SCOPE_KEY``; with ``SimConfig.sndbuf_bytes`` set, the
    connection's SO_SNDBUF is set too (on every request of the connection, idempotently).
    """

    engine: SimEngine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            transport = transport_from_send(send)
            if transport is not None:
                scope[TRANSPORT_SCOPE_KEY] = transport
                sndbuf = self.engine.config.sndbuf_bytes
                if sndbuf is not None:
                    _set_sndbuf(transport, sndbuf)
        await super().__call__(scope, receive, send)


def _set_sndbuf(transport: asyncio.BaseTransport, size: int) -> None:
    """Set SO_SNDBUF on the connection's socket (socket(7): the kernel doubles it)."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)


_warned_no_transport = False


def _open_probe(scope: Scope, engine: SimEngine) -> DeliveryProbe | None:
    """A delivery probe for this connection, or None if KV is not coupled to delivery."""
    global _warned_no_transport
    if engine.config.kv_release != "on_delivery":
        return None
    transport = scope.get(TRANSPORT_SCOPE_KEY)
    if transport is not None:
        try:
            return DeliveryProbe(transport)
        except OSError:
            pass
    if not _warned_no_transport:
        _warned_no_transport = True
        logger.warning(
            "sim: no TCP transport in the ASGI scope (not served by uvicorn?); "
            "on_delivery releases KV when the last event is handed to the server"
        )
    return None


class _EngineStreamingResponse(StreamingResponse):
    """SSE response bound to an engine request; detaches it when the response is over."""

    def __init__(
        self, content: AsyncIterator[bytes], *, engine: SimEngine, request_id: str
    ) -> None:
        super().__init__(content, media_type="text/event-stream")
        self._engine = engine
        self._request_id = request_id

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        probe = _open_probe(scope, self._engine)
        try:
            await super().__call__(scope, receive, send)
            if probe is not None:
                await probe.wait_delivered(poll_s=self._engine.config.delivery_poll_ms / 1e3)
        except asyncio.CancelledError:
            # Only uvicorn cancels this task (server shutdown past the graceful timeout,
            # with a stalled client); ending quietly keeps it from logging an error.
            pass
        finally:
            if probe is not None:
                probe.close()
            self._engine.detach(self._request_id)


class _EngineFullResponse(Response):
    """Non-streaming JSON response: waits for the whole generation, aborting on disconnect."""

    media_type = "application/json"

    def __init__(self, *, engine: SimEngine, stream: RequestStream, renderer: Renderer) -> None:
        super().__init__(content=b"", media_type=self.media_type)
        self._engine = engine
        self._stream = stream
        self._renderer = renderer

    async def _collect(self) -> bytes:
        tokens: list[int] = []
        reason: str | None = None
        while reason is None:
            new, reason = await self._stream.get()
            tokens.extend(new)
        return self._renderer.full_body(token_text(tokens), len(tokens), reason)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        probe = _open_probe(scope, self._engine)
        try:
            body = await _unless_disconnected(self._collect(), receive)
            if body is None:
                return
            self.body = body
            self.init_headers()
            await super().__call__(scope, receive, send)
            if probe is not None:
                await probe.wait_delivered(poll_s=self._engine.config.delivery_poll_ms / 1e3)
        except asyncio.CancelledError:
            pass  # server shutdown, as for streams
        finally:
            if probe is not None:
                probe.close()
            self._engine.detach(self._stream.request_id)


async def _unless_disconnected(work: Any, receive: Receive) -> bytes | None:
    """Await ``work``; None if the client disconnects first (``work`` is then cancelled)."""

    async def disconnected() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    job = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait((job, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (job, watcher):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if job.done() and not job.cancelled():
        return job.result()
    return None


async def _events(stream: RequestStream, renderer: Renderer) -> AsyncIterator[bytes]:
    """The SSE events of one streamed response, ending with ``data: [DONE]``.

    One event per batch of new tokens: one token per event while the client keeps up,
    merged tokens (and text) when it lags, as vLLM's output collector merges deltas.
    """
    chat = renderer.params.chat
    completion_tokens = 0
    reason: str | None = None
    while reason is None:
        tokens, reason = await stream.get()
        if not tokens:
            continue
        if chat and completion_tokens == 0:
            yield renderer.role_event()
        completion_tokens += len(tokens)
        yield renderer.token_event(token_text(tokens), completion_tokens, reason)
    if renderer.params.include_usage:
        yield renderer.usage_event(completion_tokens)
    yield DONE


KEEP_ALIVE = b": keep-alive\n\n"


async def _keep_alive(events: AsyncIterator[bytes], interval_s: float) -> AsyncIterator[bytes]:
    """``events`` with :data:`KEEP_ALIVE` (an SSE comment, which clients ignore but proxies
    count as traffic) whenever none came for ``interval_s``: what vLLM's
    ``--sse-keep-alive-interval`` does (``vllm/entrypoints/serve/utils/sse_keep_alive.py``).
    One pending ``anext`` at a time, never cancelled while the stream goes on."""
    pending = asyncio.ensure_future(anext(events))
    try:
        while True:
            done, _ = await asyncio.wait({pending}, timeout=interval_s)
            if not done:
                yield KEEP_ALIVE
                continue
            try:
                event = pending.result()
            except StopAsyncIteration:
                return
            yield event
            pending = asyncio.ensure_future(anext(events))
    finally:
        pending.cancel()


def _error(exc: RequestError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status)


async def _generate(request: Request, *, chat: bool) -> Response:
    engine: SimEngine = request.app.engine
    config = engine.config
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        return _error(RequestError("the request body is not valid JSON"))
    try:
        params = parse_request(body, config, chat=chat)
        response_id = stream_id(params, request.headers.get("x-request-id"))
        stream = engine.submit(
            request_id=engine_request_id(response_id, chat=chat),
            prompt_len=params.prompt_len,
            max_tokens=params.max_tokens,
            ignore_eos=params.ignore_eos,
            seed=params.seed,
            min_tokens=params.min_tokens,
            prompt_tokens=params.prompt_tokens,
        )
    except RequestError as exc:
        return _error(exc)
    except ValueError as exc:
        return _error(RequestError(str(exc)))
    renderer = Renderer(params, config.served_model_name, response_id)
    if params.stream:
        events = _events(stream, renderer)
        if config.sse_keep_alive_s > 0:
            events = _keep_alive(events, config.sse_keep_alive_s)
        return _EngineStreamingResponse(events, engine=engine, request_id=stream.request_id)
    return _EngineFullResponse(engine=engine, stream=stream, renderer=renderer)


async def _completions(request: Request) -> Response:
    return await _generate(request, chat=False)


async def _chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


async def _models(request: Request) -> Response:
    engine: SimEngine = request.app.engine
    return Response(models_body(engine.config), media_type="application/json")


async def _health(request: Request) -> Response:
    return Response(status_code=200)


async def _metrics(request: Request) -> Response:
    engine: SimEngine = request.app.engine
    return Response(engine.metrics.render(), media_type=CONTENT_TYPE)


def create_app(
    config: SimConfig | None = None, *, engine_dir: str | os.PathLike[str] | None = None
) -> SimApp:
    """Build the emulator's ASGI app (a Starlette subclass) for ``config``.

    The engine's step loop starts with the app's lifespan startup (or the first request)
    and stops at lifespan shutdown. Serve it with uvicorn for ``on_delivery`` to couple KV
    to the socket (see the module docstring). The engine is ``app.engine``.
    ``engine_dir``: where the engine writes its tables (``engine_steps.parquet``,
    ``engine_requests.parquet``, ``engine_probe.json``); None writes none. They are finished
    at lifespan shutdown (or ``app.engine.close_tables()``). Raises ``OSError`` if the
    folder is not writable.
    """
    config = config or SimConfig()
    engine = SimEngine(config, engine_dir=engine_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        engine.start()
        try:
            yield
        finally:
            await engine.stop()

    app = SimApp(
        routes=[
            Route("/v1/completions", _completions, methods=["POST"]),
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
            Route("/metrics", _metrics, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.engine = engine
    return app
