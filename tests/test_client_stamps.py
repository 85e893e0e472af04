"""Kernel arrival stamps (SO_TIMESTAMPNS) on real loopback TCP: a read that comes late keeps
the time its bytes arrived; paced readers, ``timestamps = "read"`` and reads after an action
are stamped when ``recv`` returned, and the record says which."""

from __future__ import annotations

import socket
import threading
import time
from typing import ClassVar, Literal

import pytest

from loadgen import READS, ReadBehaviour, RequestSpec, stream_request
from loadgen._actions import Stall
from loadgen._reads import Paced
from loadgen._stamps import ANCILLARY_BYTES, ArrivalClock, enable_arrival_stamps
from tests.test_client_framing import _HEAD, _chunked, _event

LATE_S = 0.5  # how long after each read returns the late reader reads again
GAP_S = 0.3  # the server's gap between events (shorter than LATE_S)


@READS.register
class LateOnArrival(ReadBehaviour):
    """Stands for a full-speed reader whose process is busy: it reads on arrival in intent
    (``reads_on_arrival``) but gets to each ``recv`` :data:`LATE_S` late."""

    kind: Literal["late_on_arrival"] = "late_on_arrival"
    bytes_per_read: ClassVar[int] = 65536
    reads_on_arrival: ClassVar[bool] = True

    def next_read_at(self, slot_s: float, returned_s: float) -> float:
        return returned_s + LATE_S


class TimedServer:
    """Answers one request with a chunked SSE head and event 0 in one write, then events 1..
    ``GAP_S`` apart, then ``[DONE]`` once the late reader has read the last event; keeps the
    monotonic time each event was written. (A read that takes several segments gets the last
    one's arrival time, so the head and event 0 go together.)"""

    def __init__(self, events: int) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.sent: list[float] = []
        self.thread = threading.Thread(target=self._serve, args=(events,), daemon=True)
        self.thread.start()

    def _serve(self, events: int) -> None:
        conn, _ = self.sock.accept()
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.recv(65536)
            head = _HEAD + b"transfer-encoding: chunked\r\n\r\n"
            for i in range(events):
                if i:
                    time.sleep(GAP_S)
                self.sent.append(time.monotonic())
                conn.sendall((b"" if i else head) + _chunked(_event(i))[: -len(b"0\r\n\r\n")])
            time.sleep(LATE_S + GAP_S)  # after the reader took the last event
            conn.sendall(_chunked(b"data: [DONE]\n\n"))
            time.sleep(0.5)
        self.sock.close()


def _run(events: int = 3, **kw: object) -> tuple[TimedServer, list[float], object]:
    server = TimedServer(events)
    spec = RequestSpec(host=server.url, model="m", prompt="p", prompt_tokens=1, timeout_s=20, **kw)  # type: ignore[arg-type]
    rec = stream_request(spec)
    server.thread.join(5)
    assert rec.outcome == "complete", rec.error
    return server, [c.t for c in rec.chunks], rec


def test_a_late_reader_keeps_the_arrival_times_of_its_events() -> None:
    server, t, rec = _run(read=LateOnArrival())
    assert rec.timestamps == "kernel"  # type: ignore[attr-defined]
    for sent, stamped in zip(server.sent, t, strict=True):
        assert 0 <= stamped - sent < 0.1  # arrival, not the late read
    gaps = [b - a for a, b in zip(t, t[1:], strict=False)]
    assert all(abs(g - GAP_S) < 0.1 for g in gaps), gaps
    assert rec.read_lag_max_ms is not None and rec.read_lag_max_ms > 100  # type: ignore[attr-defined]


def test_read_stamps_show_the_late_reads() -> None:
    server, t, rec = _run(read=LateOnArrival(), timestamps="read")
    assert (rec.timestamps, rec.read_lag_max_ms) == ("read", None)  # type: ignore[attr-defined]
    gaps = [b - a for a, b in zip(t, t[1:], strict=False)]
    assert all(g > LATE_S - 0.05 for g in gaps), gaps  # the client's lateness is in the gaps


def test_a_full_speed_reader_is_stamped_by_the_kernel() -> None:
    server, t, rec = _run()
    assert rec.timestamps == "kernel"  # type: ignore[attr-defined]
    assert rec.t_first_byte <= rec.t_first_token <= rec.t_last_byte <= rec.t_end  # type: ignore[attr-defined,operator]
    for sent, stamped in zip(server.sent, t, strict=True):
        assert 0 <= stamped - sent < 0.1


def test_a_paced_reader_is_stamped_when_it_reads() -> None:
    _, _, rec = _run(read=Paced(bytes_per_read=4096, interval_s=0.01))
    assert (rec.timestamps, rec.read_lag_max_ms) == ("read", None)  # type: ignore[attr-defined]


def test_reads_after_an_action_are_stamped_when_they_return() -> None:
    stall_s = 0.8
    server, t, rec = _run(events=4, action=Stall(after_tokens=1, stall_s=stall_s))
    assert rec.timestamps == "mixed"  # type: ignore[attr-defined]
    # event 1 arrived during the stall and was read after it: its time is the read's
    assert t[1] - server.sent[1] > stall_s - GAP_S - 0.1


def test_arrival_clock_on_a_socket_read_late() -> None:
    srv = socket.create_server(("127.0.0.1", 0))
    client = socket.socket()
    if not enable_arrival_stamps(client):
        pytest.skip("the kernel refuses SO_TIMESTAMPNS")
    client.connect(srv.getsockname())
    conn, _ = srv.accept()
    with srv, client, conn:
        clock = ArrivalClock(not_before=time.monotonic())
        sent = time.monotonic()
        conn.sendall(b"x" * 100)
        time.sleep(0.2)
        data, ancdata, _, _ = client.recvmsg(4096, ANCILLARY_BYTES)
        returned = time.monotonic()
        stamp = clock.stamp(ancdata, returned)
        assert data == b"x" * 100
        assert 0 <= stamp - sent < 0.05 and returned - stamp > 0.15
        assert clock.label == "kernel" and clock.read_lag_max_s > 0.15
        # no control message (or one out of range) falls back to the return time
        assert clock.stamp([], returned) == returned and clock.label == "mixed"


def test_the_tables_and_the_summary_say_how_reads_were_stamped() -> None:
    import pandas as pd

    from harness.analysis._summary import summarize_group
    from harness.analysis._tables import chunks_frame, requests_frame
    from loadgen import RequestRecord

    def record(rid: str, timestamps: str, lag_ms: float | None) -> RequestRecord:
        rec = RequestRecord(rid, "U", "g", "none", "completions", 8, 1, 0.0, 0.0)
        rec.timestamps, rec.read_lag_max_ms = timestamps, lag_ms
        return rec

    read_only = requests_frame([record("a", "read", None)], pd.DataFrame())
    assert read_only["read_lag_max_ms"].dtype == float  # not an all-None object column
    records = [record("a", "read", None), record("b", "kernel", 2.5), record("c", "mixed", 7.0)]
    requests = requests_frame(records, pd.DataFrame())
    summary = summarize_group("g", requests, chunks_frame(records))
    assert summary.requests_kernel_stamped == 1
    assert summary.read_lag_max_ms == pytest.approx(7.0)
