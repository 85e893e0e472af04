"""One request in flight over a plain TCP socket: connecting, sending, and the read loop that
reads at the pace a read behaviour sets, fires the action and stamps every ``recv``.

Every ``recv`` asks for exactly ``bytes_per_read`` bytes and is stamped once with
CLOCK_MONOTONIC: when the kernel received its last segment (``SO_TIMESTAMPNS``, see
``_stamps``) for a full-speed reader, so that the load process's own scheduling does not enter
TTFT and ITL, else when it returned. The bytes go to the response's parser
(:class:`~loadgen._response.Response`) once per ``recv``.

The request's deadline costs nothing per ``recv``: under gevent it is one ``gevent.Timeout``
for the whole response (a socket timeout would arm a gevent timer at every blocking ``recv``);
with plain sockets it is the socket timeout, set again only once :data:`TIMEOUT_RESET_S` old,
so a ``recv`` can outlast the deadline by at most that much.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from typing import Any

import httptools

from ._gevent_recv import WaitFirstRecv
from ._records import RequestRecord
from ._request import RequestSpec, Target, request_bytes
from ._response import Response
from ._sockets import local_address, peer_cut, response_complete_in_buffer, set_rcvbuf
from ._stamps import ANCILLARY_BYTES, ArrivalClock, enable_arrival_stamps

CUT_POLL_S = 0.02
"""How often a holding client (``stall``, ``stop_reading``) checks whether the server cut it."""
TIMEOUT_RESET_S = 0.05
"""The socket timeout is set to the time left before the deadline again once it is this old
(seconds): the most a blocked ``recv`` can outlast the deadline."""


class Stream:
    """State of one request in flight (the socket, the deadline in monotonic seconds, the
    response so far); implements ``_actions.StreamControl``."""

    def __init__(
        self, spec: RequestSpec, record: RequestRecord, deadline: float, sock: socket.socket
    ) -> None:
        self.spec = spec
        self.record = record
        self.deadline = deadline
        self.sock = sock
        self.response = Response(record, stream=spec.stream)
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
        if self.record.t_cut_seen is None and not self.response.done:
            self.record.t_cut_seen = self.now()
            self.record.cut_kind = kind

    def remaining_s(self) -> float:
        return self.deadline - self.now()

    # the exchange
    def connect(self, addr: tuple[str, int] | tuple[str, int, int, int]) -> None:
        """Set the receive buffer and arrival stamps the spec asks for, then connect (raises
        ``OSError``, ``TimeoutError`` past the deadline)."""
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
        self.record.t_connected = time.monotonic()
        self.record.client_addr, self.record.client_port = local_address(self.sock)

    def send_request(self, target: Target) -> None:
        """Send the whole request (raises ``OSError``, ``TimeoutError`` past the deadline)."""
        wire = request_bytes(self.spec, target)
        self.sock.settimeout(max(self.remaining_s(), 1e-3))
        self.sock.sendall(wire)

    def maybe_act(self) -> str | None:
        """Fire the action once its token threshold is reached, or, for an action timed from
        the send (``after_send_s``), once that time has come (reading nothing before); its
        outcome ends the stream."""
        action = self.spec.action
        if action is None or self.record.action is not None or self.response.done:
            return None
        after_send_s = action.after_send_s
        if after_send_s is None:
            if self.response.tokens.counted < action.after_tokens or self.record.http_status != 200:
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

        The loop receives with the socket's ``recv``, or with kernel arrival stamps
        (:attr:`arrival`) its ``recvmsg``, whose reads are stamped on arrival until an action
        fires and when they returned after. Under gevent it calls ``gevent.sleep(0)`` between
        a short read stamped when it returned (the socket drained) and parsing it: every other
        stream woken by the same poll takes and stamps its read first, so a burst of events
        (one per stream per engine step) is stamped before any of it is parsed.
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
            receive = WaitFirstRecv.of(sock, method) or getattr(sock, method)
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
        """The loop of :meth:`read_loop` (``receive``, ``defer``: see there), kept whole: it
        runs once per ``recv``, and a step split out would cost a call per read."""
        read = self.spec.read
        bytes_per_read = read.bytes_per_read  # type: ignore[attr-defined]
        acts = self.spec.action is not None
        sock = self.sock
        now = time.monotonic
        deadline = self.deadline
        rec = self.record
        response = self.response
        feed = response.parser.feed_data
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
            response.t_read = t
            if defer is not None and not on_arrival and len(data) < bytes_per_read:
                defer(0)  # let the other streams ready in this wake-up stamp their reads first
            try:
                feed(data)
            except httptools.HttpParserError as e:
                if not response.complete:
                    if response.body:
                        response.take_body()
                    rec.error = rec.error or f"HTTP protocol error: {e}"
                    return "protocol_error"
            if response.body:
                response.take_body()
            if response.complete:
                return "eom"

    def _at_eof(self) -> str:
        """The server closed the connection: the end of a close-delimited body, else a cut."""
        response = self.response
        if response.head_done and not response.body_framed:
            return "eom"  # RFC 9112 section 6.3: a body without framing ends at close
        if response.done:
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
