"""One streamed request over a plain TCP socket, read at the pace a read behaviour sets.

The HTTP/1.1 exchange (request, response head, chunked body) is framed by ``h11``; this module
does the socket I/O itself, so every ``recv`` asks for exactly ``bytes_per_read`` bytes. (A
client library that reads 64 KiB per ``recv``, as httpx's default transport does, would drain
the kernel buffer and defeat pacing.) Under Locust the stdlib ``socket`` and ``time.sleep`` are
monkey-patched by gevent and become cooperative; outside Locust they simply block.

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
from urllib.parse import urlsplit

import h11

from ._actions import ActionConfig
from ._openai import ENDPOINT_PATHS, Endpoint, TokenCounter, parse_payload, request_body
from ._reads import FullSpeed, ReadConfig
from ._records import Chunk, RequestRecord
from ._sockets import local_address, peer_cut, response_complete_in_buffer, set_rcvbuf
from ._sse import SSEDecoder

_MAX_ERROR_BODY_BYTES = 4096
_USER_AGENT = "zerowindow-loadgen"
CUT_POLL_S = 0.02
"""How often a holding client (``stall``, ``stop_reading``) checks whether the server cut it."""


@dataclass(frozen=True, kw_only=True)
class RequestSpec:
    """What to send, and how the client reads and behaves.

    ``host``: base URL, ``http://HOST[:PORT][/PREFIX]`` (no TLS). ``prompt_tokens`` is the
    requested prompt length (approximate tokens), recorded as is. ``timeout_s`` is the deadline
    of the whole request counted from ``t_send``. ``rcvbuf_bytes``: ``SO_RCVBUF`` set before
    ``connect`` (Linux doubles it, socket(7)); ``None`` keeps the kernel default and
    auto-tuning. ``user_class``, ``group`` and ``network_profile`` only label the record.
    """

    host: str
    model: str
    prompt: str
    prompt_tokens: int
    endpoint: Endpoint = "completions"
    max_tokens: int = 128
    ignore_eos: bool = True
    timeout_s: float = 120.0
    read: ReadConfig = field(default_factory=FullSpeed)
    action: ActionConfig | None = None
    rcvbuf_bytes: int | None = None
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    user_class: str = ""
    group: str = ""
    network_profile: str = "none"


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
        self.error_body = bytearray()

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
        if self.spec.rcvbuf_bytes is not None:
            set_rcvbuf(self.sock, self.spec.rcvbuf_bytes)  # before connect: see set_rcvbuf
        self.sock.settimeout(max(self.remaining_s(), 1e-3))
        self.sock.connect(addr)
        self.record.client_addr, self.record.client_port = local_address(self.sock)

    def send_request(self, conn: h11.Connection, target: _Target) -> None:
        spec = self.spec
        body = json.dumps(
            request_body(
                endpoint=spec.endpoint,
                model=spec.model,
                prompt=spec.prompt,
                max_tokens=spec.max_tokens,
                ignore_eos=spec.ignore_eos,
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
        wire = conn.send(request) + conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        self.sock.settimeout(max(self.remaining_s(), 1e-3))
        self.sock.sendall(wire)

    def on_body(self, data: bytes, t: float) -> None:
        rec = self.record
        if rec.http_status != 200:
            room = _MAX_ERROR_BODY_BYTES - len(self.error_body)
            self.error_body.extend(data[: max(0, room)])
            return
        for ev in self.decoder.feed(data):
            if self.done:
                continue
            payload = parse_payload(ev.data, event_type=ev.event)
            if payload.kind == "done":
                self.done = True
                continue
            if payload.kind == "error":
                if not self.error_seen:
                    self.error_seen = True
                    rec.error = payload.error
                continue
            tokens = self.tokens.chunk_tokens(payload)
            if payload.prompt_tokens is not None:
                rec.prompt_tokens = payload.prompt_tokens
            if rec.stream_id is None:
                rec.stream_id = payload.stream_id
            if payload.kind != "chunk":
                continue
            if payload.finish_reason is not None:
                rec.finish_reason = payload.finish_reason
            if tokens or payload.text:
                rec.chunks.append(Chunk(t=t, tokens=tokens, bytes=ev.wire_bytes, text=payload.text))
                if tokens and rec.t_first_token is None:
                    rec.t_first_token = t

    def maybe_act(self) -> str | None:
        """Fire the action once its token threshold is reached; its outcome ends the stream."""
        action = self.spec.action
        if action is None or self.record.action is not None or self.done:
            return None
        if self.tokens.counted < action.after_tokens or self.record.http_status != 200:
            return None
        self.record.action = action.kind
        self.record.t_action = self.now()
        return action.apply(self)

    def read_loop(self, conn: h11.Connection) -> str:
        """Read until the response ends; return the ending reason (an outcome)."""
        read = self.spec.read
        slot = self.now()
        while True:
            ended_by_action = self.maybe_act()
            if ended_by_action is not None:
                return ended_by_action
            wait_s = slot - self.now()
            if wait_s > 0 and not self.pause(wait_s):
                return "timeout"
            slot = max(slot, self.now())
            remaining = self.remaining_s()
            if remaining <= 0:
                return "timeout"
            self.sock.settimeout(remaining)
            data = self.sock.recv(read.bytes_per_read)  # type: ignore[attr-defined]  # OSError: caller
            t = self.now()
            slot = read.next_read_at(slot, t)
            rec = self.record
            if data:
                rec.bytes_received += len(data)
                rec.t_last_byte = t
                if rec.t_first_byte is None:
                    rec.t_first_byte = t
            conn.receive_data(data)
            while True:
                try:
                    event = conn.next_event()
                except h11.RemoteProtocolError as e:
                    if not data:  # EOF in the middle of the body
                        self.note_cut("fin")
                        rec.error = rec.error or f"connection closed by server: {e}"
                        return "cut_by_peer"
                    rec.error = rec.error or f"HTTP protocol error: {e}"
                    return "protocol_error"
                if event is h11.NEED_DATA:
                    break
                if isinstance(event, h11.Response):
                    rec.http_status = event.status_code
                elif isinstance(event, h11.Data):
                    self.on_body(bytes(event.data), t)
                elif isinstance(event, h11.EndOfMessage):
                    return "eom"
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    rec.error = rec.error or "connection closed by server"
                    return "cut_by_peer"
            if not data:
                self.note_cut("fin")
                rec.error = rec.error or "connection closed by server"
                return "cut_by_peer"

    def outcome(self, ending: str) -> str:
        """Final outcome: HTTP status first, then error events, `[DONE]`, then the ending."""
        rec = self.record
        if rec.http_status is not None and rec.http_status != 200:
            body = self.error_body.decode("utf-8", errors="replace").strip()
            rec.error = f"HTTP {rec.http_status}" + (f": {body[:500]}" if body else "")
            return "http_error"
        if ending == "protocol_error":
            return "http_error"
        if self.error_seen:
            return "server_error_event"
        if self.done:
            return "complete"
        if ending == "eom":
            rec.error = rec.error or "response ended without [DONE]"
            return "cut_by_peer"
        return ending


def stream_request(
    spec: RequestSpec, *, on_interrupt: Callable[[RequestRecord], None] | None = None
) -> RequestRecord:
    """Send one streaming request, read the whole response as ``spec`` says, return its record.

    Never raises for connection, HTTP or stream trouble: the record's ``outcome`` says what
    happened (``complete``, ``http_error``, ``server_error_event``, ``cut_by_peer`` for EOF,
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
        conn = h11.Connection(our_role=h11.CLIENT)
        stream.send_request(conn, target)
        ending = stream.read_loop(conn)
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
        record.completion_tokens = stream.tokens.total
        record.outcome = "client_abort"
        record.error = f"interrupted: {type(e).__name__}"
        on_interrupt(record)
        raise
    finally:
        stream.decoder.close()
        stream.sock.close()
        record.t_end = time.monotonic()
    record.completion_tokens = stream.tokens.total
    record.outcome = stream.outcome(ending)
    return record
