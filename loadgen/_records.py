"""Per-request records: the contract between the load generator and the harness.

Every streamed request yields one :class:`RequestRecord`. Load processes append records as
JSON lines to a file in the run folder and flush after each one, so a killed run loses at
most the requests that were still in flight. The harness turns these files into
``requests.parquet`` and ``chunks.parquet``.

All ``t_*`` timestamps are ``time.monotonic()`` seconds. On Linux this is CLOCK_MONOTONIC,
which is shared by every process of the machine, so records from several load processes
and the harness's own samples share one time axis (clock_gettime(2)).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

OUTCOMES = (
    "complete",  # the stream ended with `data: [DONE]`
    "http_error",  # a non-200 status, or a response that is not valid HTTP/1.1
    "server_error_event",  # an SSE event carrying an `error` payload, or malformed JSON
    "not_sse",  # a 200 not text/event-stream and no `[DONE]` came, or a coding not decoded
    "cut_by_peer",  # EOF or RST before `[DONE]`
    "client_abort",  # the client closed on purpose (half-close, abortive close, stop reading)
    "timeout",  # the client's own deadline passed
)


class Chunk(msgspec.Struct, gc=False):
    """One SSE event that carried a completion chunk (a msgspec Struct: cheap to create and to
    encode, one per event).

    ``t`` is the monotonic time (s) when the event was complete: when the kernel received the
    read's last segment, or when ``recv`` returned (the record's ``timestamps`` says which);
    ``tokens`` the output tokens it
    carried (difference of consecutive ``usage.completion_tokens`` when the server sends
    continuous usage stats, else 1 per non-empty text delta); ``bytes`` the size of the event
    on the wire; ``text`` the text delta.
    """

    t: float
    tokens: int
    bytes: int
    text: str = ""


@dataclass
class RequestRecord:
    """Everything one client saw of one streamed request.

    Times are monotonic seconds (see module docstring); ``None`` when the moment never came.
    ``stalls`` holds ``[start, end]`` pairs (monotonic s) of intervals in which the client
    deliberately did not read; ``end`` is ``None`` if it never resumed. ``action`` is the kind
    of the client action that fired (``stall``, ``stop_reading``, ``half_close``,
    ``abortive_close``) and ``t_action`` when it fired; both ``None`` if none fired.
    ``t_cut_seen`` is when the client first saw the server end the connection before the
    response was complete (``None`` if it never did): while reading, from ``recv`` returning EOF
    or ECONNRESET; while holding (``stall``, ``stop_reading``), from the TCP state polled every
    20 ms (``_stream.CUT_POLL_S``) without reading. ``cut_kind`` is ``"rst"`` or ``"fin"``. A
    FIN travels behind the bytes sent before it, so a client that does not read sees it only if
    those bytes fit its receive buffer; a RST overtakes a closed window.

    ``timestamps`` says how the reads (``t_first_byte``, ``t_last_byte``, the chunks' ``t``)
    were stamped: ``"kernel"``, each with the time the kernel received its last segment
    (``SO_TIMESTAMPNS``: full-speed readers); ``"read"``, when ``recv`` returned (paced
    readers, ``timestamps = "read"``, or a kernel that gives no stamps); ``"mixed"``, kernel
    stamps until an action fired (or where one was missing), return times after.
    ``read_lag_max_ms`` is the longest a kernel-stamped read waited in the receive buffer
    before the client took it (how late the client was); ``None`` without kernel stamps.
    ``t_scheduled`` is when an open-loop schedule meant the request to be sent (``None`` in a
    closed loop); ``t_send - t_scheduled`` is the client's send lag; ``schedule_index`` the
    request's position in the whole schedule (every load process sending a share of it).
    ``stream`` is False for a request whose answer was asked for whole (``stream: false``):
    its one chunk is the whole answer, so its first token is the whole answer's arrival.
    ``behaviour`` names the client-mix entry the request was drawn as (``None`` without a mix).
    ``clock_bound_ms`` is set by the harness, never by the client: for a record of a worker on
    another clock, moved onto the harness's (``loadgen._clock``), how far its times may be off
    against the harness's and the engine's (ms); ``None`` for a process on the harness's clock.
    ``t_connected`` is when the TCP connection was established (``None`` if it never was);
    ``trace_id`` (32 hex digits) and ``span_id`` (16) are the W3C ``traceparent`` the request
    carried: the trace of the request and the client's span in it (``None`` in records written
    before requests carried one).
    A session's turn (``loadgen._session_config``) has ``session_id`` (the same on every turn of
    one session), ``turn`` (1-based) and ``context_tokens``: the words (about tokens,
    ``loadgen._prompt``) of the earlier user messages plus the output tokens of the earlier
    answers as received, the part of the prompt a prefix cache could serve
    (``prompt_tokens_requested`` counts them with the new message); ``session_end`` is set on a
    session's last turn: ``"done"`` or ``"turn_failed"`` (its outcome ended the session). All
    ``None`` for a request outside a session.
    """

    request_id: str
    user_class: str
    group: str
    network_profile: str
    endpoint: str
    max_tokens: int
    prompt_tokens_requested: int
    t_send: float
    t_send_wall: float
    stream: bool = True  # False: the answer was asked for whole (``stream: false``)
    content_encoding: str | None = None  # the response's Content-Encoding (gzip...), if any
    outcome: str = "timeout"
    client_addr: str | None = None
    client_port: int | None = None
    http_status: int | None = None
    t_first_byte: float | None = None
    t_first_token: float | None = None
    t_last_byte: float | None = None
    t_end: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int = 0
    bytes_received: int = 0
    finish_reason: str | None = None
    error: str | None = None
    chunks: list[Chunk] = field(default_factory=list)
    stalls: list[list[float | None]] = field(default_factory=list)
    action: str | None = None
    t_action: float | None = None
    t_cut_seen: float | None = None
    cut_kind: str | None = None
    stream_id: str | None = None  # the ``id`` of the stream's chunks (engine request id prefix)
    timestamps: str = "read"
    read_lag_max_ms: float | None = None
    t_scheduled: float | None = None
    schedule_index: int | None = None
    behaviour: str | None = None
    clock_bound_ms: float | None = None
    t_connected: float | None = None
    trace_id: str | None = None
    span_id: str | None = None
    session_id: str | None = None
    turn: int | None = None
    context_tokens: int | None = None
    session_end: str | None = None

    @property
    def ttft_ms(self) -> float | None:
        """TTFT (ms) of this request (:func:`ttft_ms`)."""
        return ttft_ms(self.t_send, self.t_first_token)

    def to_json(self) -> str:
        """The record as one compact JSON object (the line format of the records files)."""
        return _ENCODER.encode(self).decode()


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(RequestRecord)


def ttft_ms(t_send: float | None, t_first_token: float | None) -> float | None:
    """Time to first token (ms): the arrival of the first token-carrying chunk minus the send,
    both monotonic seconds (DESIGN.md's vocabulary); ``None`` when either is missing. The one
    definition, used by the tables, the live progress and the Locust statistics."""
    if t_send is None or t_first_token is None:
        return None
    return (t_first_token - t_send) * 1000.0


class RecordWriter:
    """Appends records as JSON lines to ``path``, flushing (and fsyncing) after each one.

    Thread- and greenlet-safe for the writes of one process. Raises ``OSError`` if the file
    cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._lock = threading.Lock()

    def write(self, record: RequestRecord) -> None:
        """Append ``record`` as one JSON line, flushed and fsynced. Raises ``OSError``."""
        line = _ENCODER.encode(record) + b"\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            os.fsync(self._file.fileno())

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_records(path: str | os.PathLike[str]) -> Iterator[RequestRecord]:
    """Yield the records of a JSON-lines file; a truncated last line (killed writer) is skipped.

    Raises ``OSError`` if the file cannot be read and ``ValueError`` naming the file, the line
    and the field for a line that is not a record."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.endswith(b"\n"):
                break
            try:
                yield _DECODER.decode(line)
            except msgspec.DecodeError as e:
                raise ValueError(f"{path}:{lineno}: not a request record: {e}") from None
