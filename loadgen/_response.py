"""What the server sent back: the HTTP response parsed by ``httptools`` (llhttp, the parser
uvicorn uses), its SSE events turned into the record's chunks, and the outcome they add up to.

The parser hands the (de-chunked) body bytes of each ``recv`` to :meth:`Response.take_body`,
which feeds them to the SSE decoder in one call. An answer asked for whole (``stream: false``)
is kept until the message ends and read as one chunk stamped with the read that completed it.
"""

from __future__ import annotations

import zlib

import httptools

from ._openai import Payload, TokenCounter, UsualChunk, parse_payload, usual_chunk
from ._records import Chunk, RequestRecord
from ._sse import SSEDecoder

_MAX_ERROR_BODY_BYTES = 4096
DECODED = {b"gzip": 16 + zlib.MAX_WBITS, b"x-gzip": 16 + zlib.MAX_WBITS, b"deflate": zlib.MAX_WBITS}
"""The content codings the client decodes (RFC 9110 section 8.4.1), as zlib's ``wbits``."""
_MAX_ANSWER_BYTES = 64 * 1024 * 1024
"""An answer sent whole is kept up to this size; the rest is counted, not kept."""


class Response:
    """The response of one request as it arrives: the callbacks of ``httptools`` (llhttp calls
    them from ``parser.feed_data``) and the SSE events, written into ``record``. The reader sets
    :attr:`t_read`, the stamp of the ``recv`` being parsed, before feeding it."""

    def __init__(self, record: RequestRecord, *, stream: bool = True) -> None:
        self.record = record
        self.stream = stream  # False: one JSON answer, not an event stream
        self.answer = bytearray()  # the body of an answer sent whole
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
        self.content_encoding: bytes | None = None  # of the final response
        self.decoder_z: zlib._Decompress | None = None  # its decoder (gzip, deflate)
        self.undecodable = False  # a coding the client does not decode, or bytes that fail
        self.complete = False  # the response message ended
        self.body: list[bytes] = []  # body pieces of the recv being parsed (one per HTTP chunk)

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self.body_framed = True
        elif name == b"content-type":
            self.content_type = value
        elif name == b"content-encoding":
            self.content_encoding = value.strip().lower()

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if status >= 200:  # a 1xx is followed by the real response
            self.record.http_status = status
            self.head_done = True
            self.sse = self.is_sse()
            coding = self.content_encoding
            if coding is not None and coding != b"identity":
                self.record.content_encoding = coding.decode("latin-1")
                if coding in DECODED:
                    self.decoder_z = zlib.decompressobj(DECODED[coding])
        else:
            self.body_framed = False
            self.content_type = self.content_encoding = None

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

    # the events
    def take_body(self) -> None:
        """The body bytes of one ``recv`` (de-chunked): SSE events, or an error body."""
        body = self.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        rec = self.record
        if rec.content_encoding is not None:
            data = self._decoded(data)
        if not self.stream and rec.http_status == 200:
            self.answer.extend(data[: max(0, _MAX_ANSWER_BYTES - len(self.answer))])
            return
        if rec.http_status != 200 or not self.sse:
            room = _MAX_ERROR_BODY_BYTES - len(self.body_head)
            self.body_head.extend(data[: max(0, room)])
            if rec.http_status != 200:
                return
        tokens_of = self.tokens.count
        t = self.t_read
        for ev in self.decoder.feed(data):
            if self.done:
                continue
            fields = usual_chunk(ev.raw) if ev.event == "message" else None
            if fields is None:  # anything but a token chunk of the usual shape
                fields = self._other_event(parse_payload(ev.raw, event_type=ev.event))
                if fields is None:
                    continue
            text, completion_tokens, prompt_tokens, finish_reason, stream_id = fields
            tokens = tokens_of(text, completion_tokens)
            if prompt_tokens is not None:
                rec.prompt_tokens = prompt_tokens
            if rec.stream_id is None:
                rec.stream_id = stream_id
            if finish_reason is not None:
                rec.finish_reason = finish_reason
            if tokens or text:
                rec.chunks.append(Chunk(t, tokens, ev.wire_bytes, text))
                if tokens and rec.t_first_token is None:
                    rec.t_first_token = t

    def _other_event(self, payload: Payload) -> UsualChunk | None:
        """An event that :func:`usual_chunk` did not read: ``[DONE]``, an error and a
        usage-only chunk are taken here (None); a token chunk of several choices is given back
        as ``usual_chunk`` gives one."""
        rec = self.record
        kind = payload.kind
        if kind == "done":
            self.done = True
        elif kind == "error":
            if not self.error_seen:
                self.error_seen = True
                rec.error = payload.error
        elif kind == "usage":
            self.tokens.chunk_tokens(payload)
            if payload.prompt_tokens is not None:
                rec.prompt_tokens = payload.prompt_tokens
            if rec.stream_id is None:
                rec.stream_id = payload.stream_id
        else:
            return (
                payload.text,
                payload.completion_tokens,
                payload.prompt_tokens,
                payload.finish_reason,
                payload.stream_id,
            )
        return None

    def _decoded(self, data: bytes) -> bytes:
        """``data`` decoded by the response's content coding; a coding the client does not
        decode, or bytes that do not decode, leave the record's error and decode to nothing."""
        rec = self.record
        if self.decoder_z is None:
            self.undecodable = True
            rec.error = rec.error or (
                f"Content-Encoding {rec.content_encoding}: the client decodes gzip and deflate"
            )
            return b""
        try:
            return self.decoder_z.decompress(data)
        except zlib.error as exc:
            rec.error = rec.error or f"Content-Encoding {rec.content_encoding}: {exc}"
            self.decoder_z, self.undecodable = None, True
            return b""

    # the outcome
    def _with_body(self, message: str) -> str:
        body = self.body_head.decode("utf-8", errors="replace").strip()
        return message + (f": {body[:500]}" if body else "")

    def _read_answer(self) -> None:
        """The whole answer (``stream: false``), once its message ended: one chunk of all its
        tokens, stamped with the read that completed it (so its first token is the whole
        answer's arrival), or the error it holds."""
        payload = parse_payload(bytes(self.answer))
        rec = self.record
        if payload.kind == "error":
            self.error_seen = True
            rec.error = payload.error
            return
        tokens = self.tokens.chunk_tokens(payload)
        rec.prompt_tokens = payload.prompt_tokens
        rec.stream_id = payload.stream_id
        rec.finish_reason = payload.finish_reason
        rec.chunks.append(Chunk(self.t_read, tokens, len(self.answer), payload.text))
        if tokens:
            rec.t_first_token = self.t_read
        self.done = True

    def outcome(self, ending: str) -> str:
        """Final outcome, given how reading ended (``ending``: ``"eom"``, ``"protocol_error"``
        or an outcome): HTTP status first, then a 200 that is not an event stream (and never
        sent ``[DONE]``), error events, ``[DONE]``, then the ending. An answer asked for whole
        is ``complete`` once its message ended holding a completion. Sets the record's
        ``error`` where the outcome needs a detail."""
        rec = self.record
        if rec.http_status is not None and rec.http_status != 200:
            rec.error = self._with_body(f"HTTP {rec.http_status}")
            return "http_error"
        if ending == "protocol_error":
            return "http_error"
        if self.undecodable:
            return "not_sse"
        if not self.stream:
            if ending == "eom" and rec.http_status == 200 and not self.done:
                self._read_answer()
            if self.error_seen:
                return "server_error_event"
            return "complete" if self.done else ending
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
