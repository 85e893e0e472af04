"""HTTP/1.1 heads for the egress buffer (h11, RFC 9112): reading a client's request, the
proxy's own error responses, and the header fields forwarded each way.

Limits: request head (``max_header_bytes``, 431, enforced by h11's
``max_incomplete_event_size`` so a slow or endless head never grows memory past it), body
(``max_body_bytes``, 413), head within ``header_timeout_s`` (408, then close). Hop-by-hop
header fields (RFC 9110 section 7.6.1) are not forwarded. The request target sent upstream
is always origin-form: the proxy never connects anywhere but its configured upstream,
whatever the request target or ``Host`` say.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from urllib.parse import urlsplit

import h11

from harness._egress._client import READ_CHUNK, Client
from harness._egress._config import EgressConfig
from zwcore import ProxyError

UPSTREAM_MAX_HEAD_BYTES = 64 * 1024
"""Largest upstream response head accepted; a larger one is an upstream error (502)."""

HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
    }
)
"""RFC 9110 section 7.6.1 plus the legacy ``keep-alive`` and ``proxy-connection``."""

REASONS = {
    400: b"Bad Request",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
}


class Refused(ProxyError):
    """The request was answered with an error status by the proxy itself.

    Internal: raised by ``read_request`` and caught by the connection's request loop, never
    beyond it. A ``zwcore.ProxyError`` (so also an ``Exception``) like every exception class
    of the egress buffer."""

    def __init__(self, status: int, reason: str, *, linger: bool = True) -> None:
        super().__init__(status, reason)
        self.status = status
        self.reason = reason
        self.linger = linger


async def read_request(
    c: Client, cfg: EgressConfig, *, first: bool
) -> tuple[h11.Request | None, bytes]:
    """The next request and its whole body; (None, b"") if the client closed, idled out
    or sent something unanswerable. Raises ``Refused`` for a request the proxy answers
    itself (408, 413, 431, 400)."""
    conn = c.conn
    loop = asyncio.get_running_loop()
    eof = False
    deadline = loop.time() + cfg.header_timeout_s
    try:
        event = conn.next_event()  # a pipelined request may be buffered already
        if event is h11.NEED_DATA:
            # the first request's head is due header_timeout_s after the accept
            wait_s = cfg.header_timeout_s if first else cfg.keepalive_timeout_s
            try:
                async with asyncio.timeout(wait_s):
                    data = await c.reader.read(READ_CHUNK)
            except TimeoutError:
                if first:
                    raise Refused(408, "header_timeout", linger=False) from None
                return None, b""
            if not data:
                return None, b""
            if not first:
                deadline = loop.time() + cfg.header_timeout_s
            c.idle = False
            conn.receive_data(data)
            event = conn.next_event()
        c.idle = False
        async with asyncio.timeout_at(deadline if event is h11.NEED_DATA else None):
            while event is h11.NEED_DATA:
                data = await c.reader.read(READ_CHUNK)
                eof = not data
                conn.receive_data(data)
                event = conn.next_event()
    except TimeoutError:
        raise Refused(408, "header_timeout", linger=False) from None
    except h11.RemoteProtocolError as exc:
        if exc.error_status_hint == 431:
            raise Refused(431, "header_too_large") from None
        if eof:
            return None, b""  # closed in the middle of a head: nobody to answer
        raise Refused(400, "bad_request") from None
    except OSError:
        return None, b""
    if isinstance(event, h11.ConnectionClosed):
        return None, b""
    if not isinstance(event, h11.Request):
        raise Refused(400, "bad_request")
    request = event
    length = content_length(request)
    if length is not None and length > cfg.max_body_bytes:
        raise Refused(413, "body_too_large")
    body = bytearray()
    try:
        async with asyncio.timeout(cfg.body_timeout_s):
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    if conn.they_are_waiting_for_100_continue:
                        c.write(
                            conn.send(h11.InformationalResponse(status_code=100, headers=[])) or b""
                        )
                    conn.receive_data(await c.reader.read(READ_CHUNK))
                    continue
                if isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > cfg.max_body_bytes:
                        raise Refused(413, "body_too_large")
                    continue
                if isinstance(event, h11.EndOfMessage):
                    break
                return None, b""  # ConnectionClosed mid-body
    except TimeoutError:
        raise Refused(408, "body_timeout", linger=False) from None
    except (h11.RemoteProtocolError, OSError):
        return None, b""
    return request, bytes(body)


def simple_response(
    conn: h11.Connection, status: int, text: str, method: bytes | None = None
) -> bytes:
    """A complete ``Connection: close`` response with a short text body (none to a HEAD
    request, whose ``method`` is given); b"" if h11's state allows no response."""
    body = (text + "\n").encode()
    head = h11.Response(
        status_code=status,
        reason=REASONS.get(status, b""),
        headers=[
            (b"content-type", b"text/plain; charset=utf-8"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ],
    )
    try:
        out = conn.send(head) or b""
        if method != b"HEAD":
            out += conn.send(h11.Data(data=body)) or b""
        return out + (conn.send(h11.EndOfMessage()) or b"")
    except h11.LocalProtocolError:
        return b""


def connection_tokens(headers: Iterable[tuple[bytes, bytes]]) -> set[bytes]:
    """Field names listed in ``Connection`` (hop-by-hop too, RFC 9110 section 7.6.1)."""
    tokens: set[bytes] = set()
    for name, value in headers:
        if name == b"connection":
            tokens.update(t.strip().lower() for t in value.split(b",") if t.strip())
    return tokens


def content_length(request: h11.Request) -> int | None:
    for name, value in request.headers:
        if name == b"content-length":
            return int(value)  # h11 validated it
    return None


def has_body_framing(request: h11.Request) -> bool:
    return any(n in (b"content-length", b"transfer-encoding") for n, _ in request.headers)


def response_headers(response: h11.Response, *, close: bool) -> list[tuple[bytes, bytes]]:
    """Upstream response fields minus hop-by-hop ones; h11 chooses the body's framing for
    the client (``Content-Length`` kept, otherwise chunked or close-delimited; a chunked
    upstream body going to a chunked client passes through unchanged, see ``_relay``)."""
    drop = HOP_BY_HOP | connection_tokens(response.headers)
    headers = [(n, v) for n, v in response.headers if n not in drop]
    if close:
        headers.append((b"connection", b"close"))
    return headers


def upstream_headers(
    c: Client, request: h11.Request, body_len: int, *, host: bytes, framed: bool
) -> list[tuple[bytes, bytes]]:
    """The request fields to send upstream: ``Host`` set to the upstream (``host``), hop-by-hop
    fields, ``Content-Length`` and ``Expect`` dropped, ``X-Forwarded-For`` added, the body
    re-framed with ``Content-Length`` and ``Connection: close``."""
    drop = HOP_BY_HOP | connection_tokens(request.headers)
    drop |= {b"host", b"content-length", b"expect"}
    headers = [(b"host", host)]
    headers += [(n, v) for n, v in request.headers if n not in drop]
    peer = c.writer.get_extra_info("peername")
    if isinstance(peer, tuple):
        headers.append((b"x-forwarded-for", str(peer[0]).encode()))
    if framed or body_len:
        headers.append((b"content-length", str(body_len).encode()))
    headers.append((b"connection", b"close"))
    return headers


def upstream_target(request: h11.Request) -> bytes | None:
    """The request target to send upstream (origin-form), or None if it cannot be proxied.

    origin-form and ``*`` (OPTIONS) pass unchanged; absolute-form keeps only its path and
    query (RFC 9112 section 3.2.2: the authority in it is not used, the configured upstream
    is); authority-form (CONNECT) is refused: this is not a forward proxy.
    """
    target = request.target
    if request.method == b"CONNECT":
        return None
    if target.startswith(b"/") or (target == b"*" and request.method == b"OPTIONS"):
        return target
    lowered = target[:8].lower()
    if lowered.startswith((b"http://", b"https://")):
        parts = urlsplit(target.decode("ascii", "replace"))
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        return path.encode("ascii", "replace")
    return None
