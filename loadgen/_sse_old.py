"""Incremental decoder for ``text/event-stream`` (Server-Sent Events): bytes in, events out.

It follows the event-stream interpretation rules of the WHATWG HTML Living Standard, §9.2
"Server-sent events" (9.2.5 "Parsing an event stream", 9.2.6 "Interpreting an event stream"):

- lines end with CRLF, LF or CR; a CR at the end of one read and an LF at the start of the
  next are one line end;
- a UTF-8 byte order mark at the very start of the stream is skipped; the stream is decoded
  as UTF-8 with invalid bytes replaced by U+FFFD (a code point split across reads is fine,
  because lines are decoded only once complete, and CR/LF never occur inside a multi-byte
  UTF-8 sequence);
- a line starting with ``:`` is a comment; a line with a colon is ``field: value`` with one
  leading space of the value removed; a line without a colon is a field with an empty value;
- fields ``event``, ``data`` (several ``data`` lines are joined with ``\\n``), ``id`` (ignored
  if it contains NUL) and ``retry`` (ASCII digits only); other fields are ignored;
- an empty line dispatches the event; an event with an empty data buffer is not dispatched;
- at end of stream an incomplete event (no final empty line) is discarded.

The decoder does no I/O and knows nothing about OpenAI payloads (see ``_openai``).
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class SSEEvent:
    """One dispatched event.

    ``event`` is the event type (``"message"`` when the stream named none); ``data`` the data
    buffer with the final LF removed; ``id`` the last event ID at dispatch time (``""`` if none);
    ``retry_ms`` the reconnection time in milliseconds from the last valid ``retry`` field, or
    ``None``; ``wire_bytes`` the bytes of the stream consumed since the previous dispatched event
    up to and including this event's terminating empty line (comments and ignored lines in
    between count too).
    """

    data: str
    event: str = "message"
    id: str = ""
    retry_ms: int | None = None
    wire_bytes: int = 0


class SSEDecoder:
    """Turns successive byte reads of one event stream into :class:`SSEEvent` objects.

    Usage: ``for ev in decoder.feed(chunk): ...`` for each read, ``decoder.close()`` at end of
    stream. Never raises on malformed input: bytes that do not form an event are dropped as
    the spec says. Not thread-safe (one decoder per stream).
    """

    def __init__(self) -> None:
        self._buf = bytearray()  # bytes of the current, unfinished line
        self._after_cr = False  # the last line ended with CR: skip one LF at the next byte
        self._at_start = True  # BOM check still pending
        self._head = b""  # first bytes of the stream while the BOM check is pending
        self._data: list[str] = []
        self._event_type = ""
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
        if self._at_start:
            # The BOM may itself be split across reads: wait until 3 bytes are known.
            self._head += data
            if len(self._head) < 3 and _BOM.startswith(self._head):
                return []
            self._at_start = False
            data, self._head = self._head, b""
            if data.startswith(_BOM):
                data = data[3:]
                self._pending_bytes += 3
        events: list[SSEEvent] = []
        pos = 0
        raw = bytes(data)
        n = len(raw)
        if self._after_cr and n and raw[0] == 0x0A:
            pos = 1
            self._pending_bytes += 1
        self._after_cr = False
        # Next CR / LF positions at or after ``pos`` (-1: none left); searched again only when
        # passed, so a read is scanned in linear time.
        cr = raw.find(b"\r", pos)
        lf = raw.find(b"\n", pos)
        while pos < n:
            if 0 <= cr < pos:
                cr = raw.find(b"\r", pos)
            if 0 <= lf < pos:
                lf = raw.find(b"\n", pos)
            if cr < 0 and lf < 0:
                self._buf.extend(raw[pos:])
                break
            if cr < 0 or (0 <= lf < cr):
                end, next_pos = lf, lf + 1
            else:
                end = cr
                if cr + 1 < n:
                    next_pos = cr + 2 if raw[cr + 1] == 0x0A else cr + 1
                else:
                    next_pos = cr + 1
                    self._after_cr = True
            self._buf.extend(raw[pos:end])
            line_bytes = bytes(self._buf)
            self._buf.clear()
            self._pending_bytes += len(line_bytes) + (next_pos - end)
            ev = self._process_line(line_bytes.decode("utf-8", errors="replace"))
            if ev is not None:
                events.append(ev)
            pos = next_pos
        return events

    def close(self) -> None:
        """Mark end of stream; an unfinished event is discarded (WHATWG §9.2.6)."""
        self._closed = True
        self._buf.clear()
        self._data.clear()
        self._event_type = ""

    def _process_line(self, line: str) -> SSEEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None
        field, sep, value = line.partition(":")
        if sep and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event_type = value
        elif field == "data":
            self._data.append(value)
        elif field == "id":
            if "\x00" not in value:
                self._last_id = value
        elif field == "retry":
            if value and value.isascii() and value.isdigit():
                self._retry_ms = int(value)
        return None

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            # Spec: reset data and event type buffers, dispatch nothing. The bytes stay
            # counted towards the next event.
            self._event_type = ""
            return None
        ev = SSEEvent(
            data="\n".join(self._data),
            event=self._event_type or "message",
            id=self._last_id,
            retry_ms=self._retry_ms,
            wire_bytes=self._pending_bytes,
        )
        self._data.clear()
        self._event_type = ""
        self._pending_bytes = 0
        return ev
