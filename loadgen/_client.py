"""One streamed request over a plain TCP socket, read at the pace a read behaviour sets.

The request is framed by ``h11``; the response (head, chunked or sized body) is parsed by
``httptools`` (llhttp, the parser uvicorn uses), which hands the body bytes of each ``recv``
to the SSE decoder in one call. This module does the socket I/O itself, so every ``recv`` asks
for exactly ``bytes_per_read`` bytes and is stamped once with CLOCK_MONOTONIC: when the kernel
received its last segment (``SO_TIMESTAMPNS``, see ``_stamps``) for a full-speed reader, so that
the load process's own scheduling does not enter TTFT and ITL, else when it returned. (A client
library that reads 64 KiB per ``recv``, as httpx's default transport does, would drain the
kernel buffer and defeat pacing.) Under Locust the stdlib ``socket`` and ``time.sleep`` are
monkey-patched by gevent and become cooperative; outside Locust they simply block.

The request's deadline costs nothing per ``recv``: under gevent it is one ``gevent.Timeout``
for the whole response (a socket timeout would arm a gevent timer at every blocking ``recv``);
with plain sockets it is the socket timeout, set again only once :data:`TIMEOUT_RESET_S` old,
so a ``recv`` can outlast the deadline by at most that much.

:func:`stream_request` never raises for network or protocol trouble: what happened becomes the
record's ``outcome`` (see ``_records.OUTCOMES``).
"""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

import h11
import httptools

from ._actions import ActionConfig
from ._openai import ENDPOINT_PATHS, Endpoint, TokenCounter, parse_payload, request_body
from ._reads import FullSpeed, ReadConfig
from ._records import Chunk, RequestRecord
from ._sockets import local_address, peer_cut, response_complete_in_buffer, set_rcvbuf
from ._sse import SSEDecoder
from ._stamps import ANCILLARY_BYTES, ArrivalClock, enable_arrival_stamps

_MAX_ERROR_BODY_BYTES = 4096
_USER_AGENT = "zerowindow-loadgen"
CUT_POLL_S = 0.02
"""How often a holding client (``stall``, ``stop_reading``) checks whether the server cut it."""
TIMEOUT_RESET_S = 0.05
"""The socket timeout is set to the time left before the deadline again once it is this old
(seconds): the most a blocked ``recv`` can outlast the deadline."""


@dataclass(frozen=True, kw_only=True)
class RequestSpec:
    """What to send, and how the client reads and behaves.

    ``host``: base URL, ``http://HOST[:PORT][/PREFIX]`` (no TLS). ``prompt_tokens`` is the
    requested prompt length (approximate tokens), recorded as is. ``timeout_s`` is the deadline
    of the whole request counted from ``t_send``. ``rcvbuf_bytes``: ``SO_RCVBUF`` set before
    ``connect`` (Linux doubles it, socket(7)); ``None`` keeps the kernel default and
    auto-tuning. ``timestamps``: ``"kernel"`` stamps the reads of a read behaviour that reads
    on arrival (``full_speed``) with the time the kernel received their bytes, until an action
    fires; ``"read"`` stamps every read when ``recv`` returned. ``user_class``, ``group`` and
    ``network_profile`` only label the record; ``t_scheduled`` (monotonic s), the deadline an
    open-loop schedule gave the request, and ``schedule_index``, its position in the whole
    schedule, are recorded as is, and so is ``behaviour``, the name of the client-mix entry
    the request was drawn as.
    """

    host: str
    model: str
    prompt: str
    prompt_tokens: int
    endpoint: Endpoint = "completions"
    max_tokens: int = 128
    ignore_eos: bool = True
    min_tokens: bool = False
    timeout_s: float = 120.0
    read: ReadConfig = field(default_factory=FullSpeed)
    action: ActionConfig | None = None
    rcvbuf_bytes: int | None = None
    timestamps: Literal["kernel", "read"] = "kernel"
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    user_class: str = ""
    group: str = ""
    network_profile: str = "none"
    t_scheduled: float | None = None
    schedule_index: int | None = None
    behaviour: str | None = None


@dataclass(frozen=True)
class _Target:
    host: str
    port: int
    path: str
    host_header: str


def _target(base_url: str, endpoint: Endpoint) -> _Target:
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"host must be an http://HOST[:PORT] URL (no TLS), got {base_url!r}")
    port = parts.port or 80
    prefix = parts.path.rstrip("/")
    host_header = parts.netloc.rpartition("@")[2]
    return _Target(parts.hostname, port, prefix + ENDPOINT_PATHS[endpoint], host_header)


class _Stream:
    """State of one request in flight; implements ``_actions.StreamControl``."""

    def __init__(
        self, spec: RequestSpec, record: RequestRecord, deadline: float, sock: socket.socket
    ) -> None:
        self.spec = spec
        self.record = record
        self.deadline = deadline
        self.sock = sock
        self.decoder = SSEDecoder()
        self.tokens = TokenCounter()
        self.done = False  # `[DONE]` seen
        self.error_seen = False
        self.body_head = bytearray()  # the first bytes of an error's or a non-SSE body
        self.sse = False  # the final response's Content-Type is text/event-stream
        self.parser = httptools.HttpResponseParser(self)
        self.t_read = 0.0  # monotonic time of the recv being parsed
        self.head_done = False  # the final (non-1xx) response head was parsed
        self.body_framed = False  # Content-Length or chunked: EOF before the end is a cut
        self.content_type: bytes | None = None  # of the final response
        self.complete = False  # the response message ended
        self.body: list[bytes] = []  # body pieces of the recv being parsed (one per HTTP chunk)
        self.arrival: ArrivalClock | None = None  # kernel arrival stamps, when they are used

    # StreamControl
    def now(self) -> float:
        return time.monotonic()

    def pause(self, duration_s: float) -> bool:
        end = self.now() + duration_s
        if end > self.deadline:
            time.sleep(max(0.0, self.deadline - self.now()))
            return False
        time.sleep(max(0.0, end - self.now()))
        return True

    def hold(self, duration_s: float) -> str:
        """Read nothing for ``duration_s`` s while watching the connection's TCP state every
        :data:`CUT_POLL_S`. Returns ``"held"``, ``"deadline"`` (the request's deadline came
        first; the hold stops there) or ``"cut"`` (the server sent RST, or FIN before the end
        of the response: the hold stops and the record's ``t_cut_seen`` and ``cut_kind`` are
        set). A FIN right after a complete response (its last chunk is in the receive buffer)
        is the normal end, not a cut: the hold goes on."""
        end = self.now() + duration_s
        stop = min(end, self.deadline)
        fin_ok = False
        while True:
            kind = peer_cut(self.sock)
            if kind == "fin" and not fin_ok:
                fin_ok = response_complete_in_buffer(self.sock)
            if kind == "rst" or (kind == "fin" and not fin_ok):
                self.note_cut(kind)
                return "cut"
            left = stop - self.now()
            if left <= 0:
                return "held" if end <= self.deadline else "deadline"
            time.sleep(min(CUT_POLL_S, left))

    def note_cut(self, kind: str) -> None:
        """Record that the server ended the connection (``"rst"`` or ``"fin"``), once."""
        if self.record.t_cut_seen is None and not self.done:
            self.record.t_cut_seen = self.now()
            self.record.cut_kind = kind

    def remaining_s(self) -> float:
        return self.deadline - self.now()

    # the exchange
    def connect(self, addr: tuple[str, int] | tuple[str, int, int, int]) -> None:
        spec = self.spec
        if spec.rcvbuf_bytes is not None:
            set_rcvbuf(self.sock, spec.rcvbuf_bytes)  # before connect: see set_rcvbuf
        if (
            spec.timestamps == "kernel"
            and spec.read.reads_on_arrival
            and enable_arrival_stamps(self.sock)  # before connect: every segment stamped
        ):
            self.arrival = ArrivalClock(not_before=self.record.t_send)
        self.sock.settimeout(max(self.remaining_s(), 1e-3))
        self.sock.connect(addr)
        self.record.client_addr, self.record.client_port = local_address(self.sock)

    def send_request(self, target: _Target) -> None:
        spec = self.spec
        body = json.dumps(
            request_body(
                endpoint=spec.endpoint,
                model=spec.model,
                prompt=spec.prompt,
                max_tokens=spec.max_tokens,
                ignore_eos=spec.ignore_eos,
                min_tokens=spec.min_tokens,
            )
        ).encode("utf-8")
        request = h11.Request(
            method="POST",
            target=target.path,
            headers=[
                ("Host", target.host_header),
                ("User-Agent", _USER_AGENT),
                ("Content-Type", "application/json"),
                ("Accept", "text/event-stream"),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
                ("X-Request-Id", spec.request_id),
            ],
        )
        conn = h11.Connection(our_role=h11.CLIENT)
        wire = b"".join(
            conn.send(event) or b"" for event in (request, h11.Data(data=body), h11.EndOfMessage())
        )
        self.sock.settimeout(max(self.remaining_s(), 1e-3))
        self.sock.sendall(wire)

    # httptools callbacks (llhttp calls them from ``parser.feed_data``)
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self.body_framed = True
        elif name == b"content-type":
            self.content_type = value

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:  # a 1xx is followed by the real response
            self.record.http_status = status
            self.head_done = True
            self.sse = self.is_sse()
        else:
            self.body_framed = False
            self.content_type = None

    def is_sse(self) -> bool:
        """Whether the response's ``Content-Type`` is ``text/event-stream`` (WHATWG HTML,
        "Server-sent events": the media type of an event stream; parameters ignored)."""
        ct = self.content_type
        return ct is not None and ct.split(b";", 1)[0].strip().lower() == b"text/event-stream"

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    def on_body(self, data: bytes) -> None:
        self.body.append(data)  # handled once per recv, by take_body

    def take_body(self) -> None:
        """The body bytes of one ``recv`` (de-chunked): SSE events, or an error body."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        rec = self.record
        if rec.http_status != 200 or not self.sse:
            room = _MAX_ERROR_BODY_BYTES - len(self.body_head)
            self.body_head.extend(data[: max(0, room)])
            if rec.http_status != 200:
                return
        for ev in self.decoder.feed(data):
            if self.done:
                continue
            payload = parse_payload(ev.raw, event_type=ev.event)
            kind = payload.kind
            if kind == "done":
                self.done = True
                continue
            if kind == "error":
                if not self.error_seen:
                    self.error_seen = True
                    rec.error = payload.error
                continue
            tokens = self.tokens.chunk_tokens(payload)
            if payload.prompt_tokens is not None:
                rec.prompt_tokens = payload.prompt_tokens
            if rec.stream_id is None:
                rec.stream_id = payload.stream_id
            if kind != "chunk":
                continue
            if payload.finish_reason is not None:
                rec.finish_reason = payload.finish_reason
            text = payload.text
            if tokens or text:
                t = self.t_read
                rec.chunks.append(Chunk(t, tokens, ev.wire_bytes, text))
                if tokens and rec.t_first_token is None:
                    rec.t_first_token = t

    def maybe_act(self) -> str | None:
        """Fire the action once its token threshold is reached, or, for an action timed from
        the send (``after_send_s``), once that time has come (reading nothing before); its
        outcome ends the stream."""
        action = self.spec.action
        if action is None or self.record.action is not None or self.done:
            return None
        after_send_s = action.after_send_s
        if after_send_s is None:
            if self.tokens.counted < action.after_tokens or self.record.http_status != 200:
                return None
        else:
            left_s = self.record.t_send + after_send_s - self.now()
            if left_s > 0 and not self.pause(left_s):
                return "timeout"
        self.record.action = action.kind
        self.record.t_action = self.now()
        return action.apply(self)

    def read_loop(self) -> str:
        """Read until the response ends; return the ending reason (an outcome).

        Raises ``TimeoutError`` if a ``recv`` blocks past the deadline, ``OSError`` for socket
        errors. Under gevent the deadline is one ``gevent.Timeout`` for the whole read and the
        socket has no timeout (gevent arms a timer for every blocking ``recv`` of a socket with
        one); elsewhere it is the socket timeout, set again once :data:`TIMEOUT_RESET_S` old.
        """
        sock = self.sock
        method = "recv" if self.arrival is None else "recvmsg"  # recvmsg: the kernel's stamp
        if not type(sock).__module__.startswith("gevent."):
            return self._read_loop(getattr(sock, method), reset_timeout=True, defer=None)
        import gevent  # already imported: it made this socket

        sock.settimeout(None)
        guard = gevent.Timeout(max(self.remaining_s(), 0.0), TimeoutError("request deadline"))
        guard.start()
        try:
            receive = _WaitFirstRecv.of(sock, method) or getattr(sock, method)
            return self._read_loop(receive, reset_timeout=False, defer=gevent.sleep)
        finally:
            guard.close()

    def _read_loop(
        self,
        receive: Callable[..., Any],
        *,
        reset_timeout: bool,
        defer: Callable[[float], None] | None,
    ) -> str:
        """The loop of :meth:`read_loop`. ``receive`` is the socket's ``recv``, or with kernel
        arrival stamps (:attr:`arrival`) its ``recvmsg``, whose reads are stamped on arrival
        until an action fires and when they returned after. ``defer(0)``, when given, is
        called between a short read stamped when it returned (the socket drained) and parsing
        it: under gevent it lets every other stream woken by the same poll take and stamp its
        read first, so a burst of events (one per stream per engine step) is stamped before any
        of it is parsed."""
        read = self.spec.read
        bytes_per_read = read.bytes_per_read  # type: ignore[attr-defined]
        acts = self.spec.action is not None
        sock = self.sock
        now = time.monotonic
        deadline = self.deadline
        rec = self.record
        feed = self.parser.feed_data
        arrival = self.arrival
        on_arrival = arrival is not None  # stamp reads on arrival (until an action fires)
        timeout_set_at = -TIMEOUT_RESET_S if reset_timeout else float("inf")
        slot = now()
        while True:
            if acts:
                ended_by_action = self.maybe_act()
                if ended_by_action is not None:
                    return ended_by_action
                if rec.action is not None:
                    on_arrival = False  # reads after a stall come late on purpose
            t = now()
            if slot > t:
                if not self.pause(slot - t):
                    return "timeout"
                t = now()
            else:
                slot = t
            remaining = deadline - t
            if remaining <= 0:
                return "timeout"
            if t - timeout_set_at >= TIMEOUT_RESET_S:
                sock.settimeout(remaining)
                timeout_set_at = t
            # OSError, TimeoutError: the caller
            if arrival is None:
                data = receive(bytes_per_read)
                returned = t = now()
            else:
                data, ancdata, _, _ = receive(bytes_per_read, ANCILLARY_BYTES)
                returned = now()
                if on_arrival:
                    t = arrival.stamp(ancdata, returned)
                else:
                    t = returned
                    arrival.returned()
            slot = read.next_read_at(slot, returned)
            if not data:
                return self._at_eof()
            rec.bytes_received += len(data)
            rec.t_last_byte = t
            if rec.t_first_byte is None:
                rec.t_first_byte = t
            self.t_read = t
            if defer is not None and not on_arrival and len(data) < bytes_per_read:
                defer(0)  # let the other streams ready in this wake-up stamp their reads first
            try:
                feed(data)
            except httptools.HttpParserError as e:
                if not self.complete:
                    if self.body:
                        self.take_body()
                    rec.error = rec.error or f"HTTP protocol error: {e}"
                    return "protocol_error"
            if self.body:
                self.take_body()
            if self.complete:
                return "eom"

    def _at_eof(self) -> str:
        """The server closed the connection: the end of a close-delimited body, else a cut."""
        if self.head_done and not self.body_framed:
            return "eom"  # RFC 9112 section 6.3: a body without framing ends at close
        if self.done:
            return "eom"  # `[DONE]` came: the stream is whole, only its framing was not
        self.note_cut("fin")
        self.record.error = self.record.error or "connection closed by server"
        return "cut_by_peer"

    def record_stamps(self) -> None:
        """Say in the record how its reads were stamped (``timestamps``, ``read_lag_max_ms``)."""
        arrival, rec = self.arrival, self.record
        rec.timestamps = "read" if arrival is None else arrival.label
        if arrival is not None and arrival.kernel_reads:
            rec.read_lag_max_ms = arrival.read_lag_max_s * 1000.0

    def _with_body(self, message: str) -> str:
        body = self.body_head.decode("utf-8", errors="replace").strip()
        return message + (f": {body[:500]}" if body else "")

    def outcome(self, ending: str) -> str:
        """Final outcome: HTTP status first, then a 200 that is not an event stream (and
        never sent ``[DONE]``), error events, ``[DONE]``, then the ending."""
        rec = self.record
        if rec.http_status is not None and rec.http_status != 200:
            rec.error = self._with_body(f"HTTP {rec.http_status}")
            return "http_error"
        if ending == "protocol_error":
            return "http_error"
        if rec.http_status == 200 and not self.sse and not self.done and not self.error_seen:
            ct = "none" if self.content_type is None else self.content_type.decode("latin-1")
            rec.error = self._with_body(f"HTTP 200 with Content-Type {ct}, not text/event-stream")
            return "not_sse"
        if self.error_seen:
            return "server_error_event"
        if self.done:
            return "complete"
        if ending == "eom":
            rec.error = rec.error or "response ended without [DONE]"
            return "cut_by_peer"
        return ending


class _WaitFirstRecv:
    """``recv`` (or ``recvmsg``) of a gevent socket that, after a read that drained the
    socket, waits for it to be readable before calling ``recv(2)`` (gevent's own ``recv`` tries
    first, fails with EAGAIN, raises and catches it, then waits: a system call and an exception
    per wake-up).
    It uses gevent's socket internals (``_sock``, ``_wait``, ``_read_event``, the same since
    gevent 1.x); :meth:`of` gives None where they are missing. The socket must have no
    timeout (the request's deadline is a ``gevent.Timeout``)."""

    __slots__ = ("_recv", "_wait", "_readable", "_drained")

    def __init__(self, sock: Any, method: str) -> None:
        self._recv = getattr(sock._sock, method)
        self._wait = sock._wait
        self._readable = sock._read_event
        self._drained = False

    @classmethod
    def of(cls, sock: socket.socket, method: str) -> _WaitFirstRecv | None:
        """The wrapper of ``sock``'s ``method`` (``"recv"`` or ``"recvmsg"``), or None."""
        if all(hasattr(sock, a) for a in ("_sock", "_wait", "_read_event")):
            return cls(sock, method)
        return None

    def __call__(self, n: int, *args: int) -> Any:
        if self._drained:
            self._wait(self._readable)
        while True:
            try:
                result = self._recv(n, *args)
            except BlockingIOError:
                self._wait(self._readable)
                continue
            self._drained = len(result[0] if args else result) < n
            return result


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
    target = _target(spec.host, spec.endpoint)
    t_send = time.monotonic()
    record = RequestRecord(
        request_id=spec.request_id,
        user_class=spec.user_class,
        group=spec.group,
        network_profile=spec.network_profile,
        endpoint=spec.endpoint,
        max_tokens=spec.max_tokens,
        prompt_tokens_requested=spec.prompt_tokens,
        t_send=t_send,
        t_send_wall=time.time(),
        t_scheduled=spec.t_scheduled,
        schedule_index=spec.schedule_index,
        behaviour=spec.behaviour,
    )
    try:
        family, type_, proto, _, addr = socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM
        )[0]
        sock = socket.socket(family, type_, proto)
    except OSError as e:
        record.error = f"{type(e).__name__}: {e}"
        record.outcome = "cut_by_peer"
        record.t_end = time.monotonic()
        return record
    stream = _Stream(spec, record, t_send + spec.timeout_s, sock)
    ending = "timeout"
    try:
        stream.connect(addr)  # type: ignore[arg-type]
        stream.send_request(target)
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
        record.t_end = time.monotonic()
        stream.record_stamps()
        record.completion_tokens = stream.tokens.total
        record.outcome = "client_abort"
        record.error = f"interrupted: {type(e).__name__}"
        on_interrupt(record)
        raise
    finally:
        stream.decoder.close()
        stream.sock.close()
        record.t_end = time.monotonic()
        stream.record_stamps()
    record.completion_tokens = stream.tokens.total
    record.outcome = stream.outcome(ending)
    return record
