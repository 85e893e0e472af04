"""What one streamed request sends: its specification (:class:`RequestSpec`), the target its
base URL names, and the request's bytes (framed by ``h11``, once per request)."""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import urlsplit

import h11

from ._actions import ActionConfig
from ._openai import ENDPOINT_PATHS, Endpoint, request_body
from ._reads import FullSpeed, ReadConfig

USER_AGENT = "zerowindow-loadgen"


def new_traceparent() -> str:
    """A fresh W3C ``traceparent`` header value, ``00-<trace-id>-<parent-id>-01``: version 00,
    a random 16-byte trace id and 8-byte span id (the client's span of the request) as lower-case
    hex, flags ``01`` (sampled, so that a server that traces records its spans). All-zero ids are
    invalid and drawn again (W3C Trace Context, section 3.2, https://www.w3.org/TR/trace-context/).
    Built from ``os.urandom`` alone (about a microsecond: no tracing SDK on the client's path)."""
    while True:
        raw = os.urandom(24)
        if any(raw[:16]) and any(raw[16:]):
            hexed = raw.hex()
            return f"00-{hexed[:32]}-{hexed[32:]}-01"


def trace_ids(traceparent: str) -> tuple[str, str]:
    """The trace id (32 hex digits) and parent span id (16) of a version-00 ``traceparent``
    value (:func:`new_traceparent`)."""
    return traceparent[3:35], traceparent[36:52]


@dataclass(frozen=True, kw_only=True)
class RequestSpec:
    """What to send, and how the client reads and behaves.

    ``host``: base URL, ``http://HOST[:PORT][/PREFIX]`` (no TLS). ``stream``: streamed (SSE),
    or ``False``, the answer sent whole (one JSON body). ``accept_encoding``: the
    ``Accept-Encoding`` header sent (``None``: none). ``prompt_tokens`` is the
    requested prompt length (approximate tokens), recorded as is. ``timeout_s`` is the deadline
    of the whole request counted from ``t_send``. ``rcvbuf_bytes``: ``SO_RCVBUF`` set before
    ``connect`` (Linux doubles it, socket(7)); ``None`` keeps the kernel default and
    auto-tuning. ``timestamps``: ``"kernel"`` stamps the reads of a read behaviour that reads
    on arrival (``full_speed``) with the time the kernel received their bytes, until an action
    fires; ``"read"`` stamps every read when ``recv`` returned. ``user_class``, ``group`` and
    ``network_profile`` only label the record; ``t_scheduled`` (monotonic s), the deadline an
    open-loop schedule gave the request, and ``schedule_index``, its position in the whole
    schedule, are recorded as is, and so is ``behaviour``, the name of the client-mix entry
    the request was drawn as. ``traceparent``: the W3C trace context sent with the request
    (default: a fresh trace and span id, :func:`new_traceparent`), recorded as the record's
    ``trace_id`` and ``span_id``. ``messages``: the chat messages sent in place of one user
    message of ``prompt`` (a session's turn; ``endpoint`` must be ``"chat"``); ``session_id``,
    ``turn`` and ``context_tokens`` are recorded as is (:class:`~loadgen._records.RequestRecord`).
    """

    host: str
    model: str
    prompt: str
    prompt_tokens: int
    endpoint: Endpoint = "completions"
    stream: bool = True
    max_tokens: int = 128
    ignore_eos: bool = True
    accept_encoding: str | None = None
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
    traceparent: str = field(default_factory=new_traceparent)
    messages: tuple[dict[str, str], ...] | None = None
    session_id: str | None = None
    turn: int | None = None
    context_tokens: int | None = None


@dataclass(frozen=True)
class Target:
    """Where a request goes: ``host`` and ``port`` to connect to, the request ``path`` and its
    ``Host`` header."""

    host: str
    port: int
    path: str
    host_header: str


def target(base_url: str, endpoint: Endpoint) -> Target:
    """The target of ``endpoint`` under ``base_url`` (``http://HOST[:PORT][/PREFIX]``; port 80
    by default). Raises ``ValueError`` for a URL that is not ``http://`` with a host."""
    parts = urlsplit(base_url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"host must be an http://HOST[:PORT] URL (no TLS), got {base_url!r}")
    port = parts.port or 80
    prefix = parts.path.rstrip("/")
    host_header = parts.netloc.rpartition("@")[2]
    return Target(parts.hostname, port, prefix + ENDPOINT_PATHS[endpoint], host_header)


def request_bytes(spec: RequestSpec, target: Target) -> bytes:
    """The whole HTTP/1.1 request of ``spec`` to ``target``: a ``POST`` of the endpoint's JSON
    body with ``Accept: text/event-stream`` (``application/json`` when not streamed),
    ``Connection: close``, ``X-Request-Id``, ``traceparent`` (W3C Trace Context) and
    ``Accept-Encoding`` when the spec has one. Raises ``ValueError`` for ``messages`` with
    an endpoint other than chat."""
    body = json.dumps(
        request_body(
            endpoint=spec.endpoint,
            model=spec.model,
            prompt=spec.prompt,
            messages=spec.messages,
            max_tokens=spec.max_tokens,
            ignore_eos=spec.ignore_eos,
            min_tokens=spec.min_tokens,
            stream=spec.stream,
        )
    ).encode("utf-8")
    request = h11.Request(
        method="POST",
        target=target.path,
        headers=[
            ("Host", target.host_header),
            ("User-Agent", USER_AGENT),
            ("Content-Type", "application/json"),
            ("Accept", "text/event-stream" if spec.stream else "application/json"),
            ("Content-Length", str(len(body))),
            ("Connection", "close"),
            ("X-Request-Id", spec.request_id),
            ("traceparent", spec.traceparent),
            *([("Accept-Encoding", spec.accept_encoding)] if spec.accept_encoding else []),
        ],
    )
    conn = h11.Connection(our_role=h11.CLIENT)
    return b"".join(
        conn.send(event) or b"" for event in (request, h11.Data(data=body), h11.EndOfMessage())
    )
