"""One streamed request over a plain TCP socket, read at the pace a read behaviour sets:
:func:`stream_request`, the client every user class calls.

The parts, one module each: what is sent (``_request``: the spec, the target, the request's
bytes framed by ``h11``), the request in flight (``_stream``: the socket, the deadline, the
action's controls and the read loop, which does the socket I/O itself so that every ``recv``
asks for exactly ``bytes_per_read`` bytes and is stamped once), what came back
(``_response``: the response parsed by ``httptools``, its SSE events, the outcome), and the
cheaper ``recv`` of gevent sockets (``_gevent_recv``). (A client library that reads 64 KiB per
``recv``, as httpx's default transport does, would drain the kernel buffer and defeat pacing.)
Under Locust the stdlib ``socket`` and ``time.sleep`` are monkey-patched by gevent and become
cooperative; outside Locust they simply block.

:func:`stream_request` never raises for network or protocol trouble: what happened becomes the
record's ``outcome`` (see ``_records.OUTCOMES``).
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from ._records import RequestRecord
from ._request import RequestSpec, target, trace_ids
from ._stream import Stream


def _record(spec: RequestSpec, t_send: float) -> RequestRecord:
    """The record of ``spec``'s request, sent at ``t_send`` (monotonic s), before any reply."""
    trace_id, span_id = trace_ids(spec.traceparent)
    return RequestRecord(
        request_id=spec.request_id,
        user_class=spec.user_class,
        group=spec.group,
        network_profile=spec.network_profile,
        endpoint=spec.endpoint,
        stream=spec.stream,
        max_tokens=spec.max_tokens,
        prompt_tokens_requested=spec.prompt_tokens,
        t_send=t_send,
        t_send_wall=time.time(),
        t_scheduled=spec.t_scheduled,
        schedule_index=spec.schedule_index,
        behaviour=spec.behaviour,
        session_id=spec.session_id,
        turn=spec.turn,
        context_tokens=spec.context_tokens,
        trace_id=trace_id,
        span_id=span_id,
    )


def _interrupted(
    stream: Stream, exc: BaseException, on_interrupt: Callable[[RequestRecord], None]
) -> None:
    """Close the record of a request whose caller was interrupted (``exc``) as
    ``client_abort`` and hand it to ``on_interrupt``."""
    record = stream.record
    record.t_end = time.monotonic()
    stream.record_stamps()
    record.completion_tokens = stream.response.tokens.total
    record.outcome = "client_abort"
    record.error = f"interrupted: {type(exc).__name__}"
    on_interrupt(record)


def stream_request(
    spec: RequestSpec, *, on_interrupt: Callable[[RequestRecord], None] | None = None
) -> RequestRecord:
    """Send one streaming request, read the whole response as ``spec`` says, return its record.

    Never raises for connection, HTTP or stream trouble: the record's ``outcome`` says what
    happened (``complete``, ``http_error``, ``server_error_event``, ``not_sse`` for a 200
    that is not ``text/event-stream`` and never sent ``[DONE]``, ``cut_by_peer`` for EOF,
    ECONNRESET or a refused connection before ``[DONE]``, ``client_abort``, ``timeout``) and
    ``error`` has the detail. Raises ``ValueError`` for a host that is not an ``http://`` URL.
    Blocks (cooperatively under gevent) until the response ends or ``spec.timeout_s`` passes.

    If the caller is interrupted mid-request (``GreenletExit`` when Locust stops a user,
    ``KeyboardInterrupt``...), the record so far gets outcome ``client_abort`` and error
    ``interrupted: <exception>``, is passed to ``on_interrupt``, and the exception propagates.
    """
    to = target(spec.host, spec.endpoint)
    t_send = time.monotonic()
    record = _record(spec, t_send)
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            to.host, to.port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, type_, proto)
    except OSError as e:
        record.error = f"{type(e).__name__}: {e}"
        record.outcome = "cut_by_peer"
        record.t_end = time.monotonic()
        return record
    stream = Stream(spec, record, t_send + spec.timeout_s, sock)
    ending = "timeout"
    try:
        stream.connect(addr)  # type: ignore[arg-type]
        stream.send_request(to)
        ending = stream.read_loop()
    except TimeoutError:  # socket.timeout is TimeoutError since 3.10
        ending = "timeout"
    except OSError as e:  # ECONNRESET, ECONNREFUSED, EPIPE, name resolution...
        if isinstance(e, ConnectionResetError) and record.http_status is not None:
            stream.note_cut("rst")
        record.error = record.error or f"{type(e).__name__}: {e}"
        ending = "cut_by_peer"
    except BaseException as e:  # not an Exception: GreenletExit, KeyboardInterrupt, SystemExit
        if isinstance(e, Exception) or on_interrupt is None:
            raise
        _interrupted(stream, e, on_interrupt)
        raise
    finally:
        stream.response.decoder.close()
        stream.sock.close()
        record.t_end = time.monotonic()
        stream.record_stamps()
    record.outcome = stream.response.outcome(ending)  # first: it reads an answer sent whole
    record.completion_tokens = stream.response.tokens.total
    return record
