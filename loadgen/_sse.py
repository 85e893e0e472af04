"""Incremental decoder for ``text/event-stream`` (Server-Sent Events): bytes in, events out.

It follows the event-stream interpretation rules of the WHATWG HTML Living Standard, §9.2
"Server-sent events" (9.2.5 "Parsing an event stream", 9.2.6 "Interpreting an event stream"):

- lines end with CRLF, LF or CR; a CR at the end of one read and an LF at the start of the
  next are one line end;
- a UTF-8 byte order mark at the very start of the stream is skipped; the stream is decoded
  as UTF-8 with invalid bytes replaced by U+FFFD (a code point split across reads is fine,
  because fields are decoded only once their line is complete, and CR/LF never occur inside a
  multi-byte UTF-8 sequence);
- a line starting with ``:`` is a comment; a line with a colon is ``field: value`` with one
  leading space of the value removed; a line without a colon is a field with an empty value;
- fields ``event``, ``data`` (several ``data`` lines are joined with ``\\n``), ``id`` (ignored
  if it contains NUL) and ``retry`` (ASCII digits only); other fields are ignored;
- an empty line dispatches the event; an event with an empty data buffer is not dispatched;
- at end of stream an incomplete event (no final empty line) is discarded.

The decoder works on bytes: lines are split with ``bytes.split`` (or one regular expression
when the stream carries CRs), fields are compared as bytes, and an event's data stays bytes
(:attr:`SSEEvent.raw`) so a JSON decoder can take it without a UTF-8 round trip;
:attr:`SSEEvent.data` decodes it on demand. It does no I/O and knows nothing about OpenAI
payloads (see ``_openai``).
"""

from __future__ import annotations

import re

import msgspec

_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"(\r\n|\r|\n)")


class SSEEvent(msgspec.Struct, frozen=True, gc=False):
    """One dispatched event.

    ``raw`` is the data buffer as bytes with the final LF removed (:attr:`data` is the same
    decoded as UTF-8, invalid bytes replaced); ``event`` the event type (``"message"`` when the
    stream named none); ``id`` the last event ID at dispatch time (``""`` if none);
    ``retry_ms`` the reconnection time in milliseconds from the last valid ``retry`` field, or
    ``None``; ``wire_bytes`` the bytes of the stream consumed since the previous dispatched
    event up to and including this event's terminating empty line (comments and ignored lines
    in between count too).
    """

    raw: bytes
    event: str = "message"
    id: str = ""
    retry_ms: int | None = None
    wire_bytes: int = 0

    @property
    def data(self) -> str:
        """The data buffer decoded as UTF-8 (WHATWG §9.2.5: invalid bytes become U+FFFD)."""
        return self.raw.decode("utf-8", "replace")


def _text(value: bytes) -> str:
    return value.decode("utf-8", "replace")


def _data_lines(blocks: list[bytes], buf: bytes, last: bytes) -> bool:
    """Whether every complete event of a read (``buf``, LF line ends only, split at its empty
    lines into ``blocks`` and ``last``) is one ``data: `` line: one event is looked at, more are
    counted over the whole read (none holds an LF and each starts with ``data: `` when the LFs
    are two per event and every ``\\n\\n`` but the last is followed by ``data: ``)."""
    if len(blocks) == 1:
        return blocks[0][:6] == b"data: " and b"\n" not in blocks[0]
    return (
        blocks[0][:6] == b"data: "
        and buf.count(b"\n") == 2 * len(blocks) + last.count(b"\n")
        and buf.count(b"\n\ndata: ") == len(blocks) - 1 + last.startswith(b"data: ")
    )


class SSEDecoder:
    """Turns successive byte reads of one event stream into :class:`SSEEvent` objects.

    Usage: ``for ev in decoder.feed(chunk): ...`` for each read, ``decoder.close()`` at end of
    stream. Never raises on malformed input: bytes that do not form an event are dropped as
    the spec says. Not thread-safe (one decoder per stream).
    """

    __slots__ = (
        "_rest",
        "_after_cr",
        "_at_start",
        "_data",
        "_event_type",
        "_last_id",
        "_retry_ms",
        "_pending_bytes",
        "_closed",
    )

    def __init__(self) -> None:
        # bytes read but not interpreted yet: the unfinished event (LF streams), line (CR
        # streams) or byte order mark, in pieces joined once an event can end
        self._rest: list[bytes] = []
        self._after_cr = False  # the last line ended with CR: skip one LF at the next byte
        self._at_start = True  # BOM check still pending
        self._data: list[bytes] = []
        self._event_type = b""
        self._last_id = ""
        self._retry_ms: int | None = None
        self._pending_bytes = 0  # bytes consumed since the last dispatched event
        self._closed = False

    def feed(self, data: bytes) -> list[SSEEvent]:
        """Consume one read; return the events it completed (possibly none), in order.

        Raises ``RuntimeError`` if called after :meth:`close`.
        """
        if self._closed:
            raise RuntimeError("SSEDecoder.feed() after close()")
        if not data:
            return []
        rest = self._rest
        if not self._at_start and b"\r" not in data:
            # No event ends in this read: keep it for later (joined once one does), so a
            # long event read in small pieces is joined once, not once per read.
            if b"\n\n" not in data and not (
                data[:1] == b"\n" and (not rest or rest[-1][-1:] == b"\n")
            ):
                if not self._after_cr or data[:1] != b"\n":
                    self._after_cr = False
                    rest.append(bytes(data))
                    return []
        buf = b"".join((*rest, data)) if rest else bytes(data)
        rest.clear()
        if self._at_start:
            # The BOM may itself be split across reads: wait until 3 bytes are known.
            if len(buf) < 3 and _BOM.startswith(buf):
                rest.append(buf)
                return []
            self._at_start = False
            if buf.startswith(_BOM):
                buf = buf[3:]
                self._pending_bytes += 3
        if self._after_cr:
            self._after_cr = False
            if buf[:1] == b"\n":
                buf = buf[1:]
                self._pending_bytes += 1
        events: list[SSEEvent] = []
        if b"\r" not in buf:  # LF line ends only (vLLM, OpenAI): the fast path
            stripped = buf.lstrip(b"\n")  # buf starts a line: leading LFs are empty lines
            for _ in range(len(buf) - len(stripped)):
                self._line(b"", 1, events)
            buf = stripped
            blocks = buf.split(b"\n\n")  # each but the last: the lines of one event
            last = blocks.pop()
            if last:
                rest.append(last)
            simple = not self._data and not self._event_type  # no event begun before
            if blocks and simple and _data_lines(blocks, buf, last):
                last_id, retry_ms = self._last_id, self._retry_ms
                pending = self._pending_bytes
                self._pending_bytes = 0
                for block in blocks:  # the stream's usual events, dispatched here
                    wire_bytes = pending + len(block) + 2  # its line and the empty line
                    events.append(SSEEvent(block[6:], "message", last_id, retry_ms, wire_bytes))
                    pending = 0
                return events
            for block in blocks:
                for line in block.split(b"\n"):
                    self._line(line, 1, events)
                self._line(b"", 1, events)
            return events
        parts = _EOL.split(buf)  # [line, eol, line, eol, ..., rest]
        if parts[-1]:
            rest.append(parts[-1])
        elif buf.endswith(b"\r"):
            self._after_cr = True  # an LF at the start of the next read ends nothing more
        for i in range(0, len(parts) - 1, 2):
            self._line(parts[i], len(parts[i + 1]), events)
        return events

    def close(self) -> None:
        """Mark end of stream; an unfinished event is discarded (WHATWG §9.2.6)."""
        self._closed = True
        self._rest.clear()
        self._data.clear()
        self._event_type = b""

    def _line(self, line: bytes, eol_bytes: int, events: list[SSEEvent]) -> None:
        """One complete line (without its ``eol_bytes``-byte line end)."""
        self._pending_bytes += len(line) + eol_bytes
        if line:
            self._field(line)
        elif self._data:
            events.append(self._dispatch())
        else:
            self._event_type = b""  # spec: an empty data buffer dispatches nothing

    def _field(self, line: bytes) -> None:
        if line.startswith(b"data:"):
            value = line[5:]
            self._data.append(value[1:] if value[:1] == b" " else value)
            return
        if line[:1] == b":":
            return  # a comment
        name, sep, value = line.partition(b":")
        if sep and value[:1] == b" ":
            value = value[1:]
        if name == b"data":  # "data" without a colon: an empty value
            self._data.append(value)
        elif name == b"event":
            self._event_type = value
        elif name == b"id":
            if b"\x00" not in value:
                self._last_id = _text(value)
        elif name == b"retry":
            if value and value.isdigit():  # bytes.isdigit: ASCII digits only
                self._retry_ms = int(value)

    def _dispatch(self) -> SSEEvent:
        data = self._data
        ev = SSEEvent(
            data[0] if len(data) == 1 else b"\n".join(data),
            _text(self._event_type) if self._event_type else "message",
            self._last_id,
            self._retry_ms,
            self._pending_bytes,
        )
        data.clear()
        self._event_type = b""
        self._pending_bytes = 0
        return ev
