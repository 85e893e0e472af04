"""Measuring a shaped link through the path itself: RTT, throughput each way, loss each way.

The server side listens in ``server_netns`` on ``server_addr`` (ephemeral ports), the client side
runs in ``client_netns``; both are plain sockets of this process, created in their namespace
(:func:`netem._nsexec.socket_in`), so nothing is started or left behind.

* RTT: ``rtt_samples`` one-byte request/response round trips on a TCP connection with
  TCP_NODELAY. ``rtt_ms`` is the kernel's smoothed RTT of that connection afterwards
  (``tcpi_rtt``, ``tcp(7)`` TCP_INFO): it is timed by the kernel, so a busy harness process does
  not inflate it. ``app_rtt_min_ms``/``app_rtt_p50_ms`` are the round trips as this process timed
  them; on a loaded machine (measured: four busy loops on two cores) the median grows by 5-20 ms
  of scheduling delay of the probe itself while ``rtt_ms`` stays within 1-2 ms of the link's.
* Throughput: a bulk TCP transfer each way for ``duration_s``, or 8 RTTs when longer; the rate
  at which data segments reached the receiver (``tcpi_data_segs_in`` x ``tcpi_rcv_mss``, the
  least-squares slope over the second half of the window, kbit/s, 1 kbit = 1000 bit), so slow
  start on a long-RTT link does not count, nor do in-order delivery stalls while TCP recovers a
  segment the rate limiter's queue dropped (retransmissions count, as they use the link).
  Payload only: on a rate-limited link it is ~95 % of ``rate_kbit`` (1448 payload bytes per
  1514-byte frame).
* Loss: ``udp_packets`` numbered UDP datagrams each way, paced below the link's rate so the rate
  limiter's queue does not add loss of its own; loss = share not received (%).
"""

from __future__ import annotations

import select
import socket
import statistics
import struct
import threading
import time
from dataclasses import asdict, dataclass

import numpy as np

from netem._nsexec import socket_in
from netem._profiles import LinkProfile

_UDP_PAYLOAD = 64
_UDP_WIRE_BITS = (_UDP_PAYLOAD + 8 + 20 + 14) * 8
# struct tcp_info, include/uapi/linux/tcp.h: __u32 tcpi_rcv_mss, tcpi_rtt (us), tcpi_data_segs_in
_TCPI_RCV_MSS_OFFSET = 20
_TCPI_RTT_OFFSET = 68
_TCPI_DATA_SEGS_IN_OFFSET = 152
_TCP_INFO_LEN = 160


@dataclass(frozen=True)
class LinkMeasurement:
    """Measured figures of a link (see module doc for the method). None: not measured.

    ``duration_s`` is the bulk-transfer window used per direction (0 without throughput);
    ``errors`` says why a throughput figure is None although it was asked for.
    """

    rtt_ms: float
    app_rtt_min_ms: float
    app_rtt_p50_ms: float
    down_kbit: float | None
    up_kbit: float | None
    down_loss_pct: float | None
    up_loss_pct: float | None
    udp_packets: int
    duration_s: float
    errors: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, float | int | None]:
        return asdict(self)


def _listener(netns: str | None, addr: str, kind: int = socket.SOCK_STREAM) -> socket.socket:
    s = socket_in(netns, socket.AF_INET, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, 0))
    if kind == socket.SOCK_STREAM:
        s.listen(8)
    return s


def _connect(netns: str | None, addr: tuple[str, int], timeout: float) -> socket.socket:
    c = socket_in(netns)
    c.settimeout(timeout)
    c.connect(addr)
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def _rtt(client_netns: str | None, server_netns: str | None, server_addr: str, samples: int,
         timeout: float, max_s: float = 1e9) -> tuple[float, float, float]:
    lst = _listener(server_netns, server_addr)
    lst.settimeout(timeout)

    def echo() -> None:
        try:
            conn, _ = lst.accept()
        except OSError:
            return
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(timeout)
            try:
                while data := conn.recv(16):
                    conn.sendall(data)
            except OSError:
                pass

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    try:
        with _connect(client_netns, lst.getsockname(), timeout) as c:
            rtts: list[float] = []
            start = time.perf_counter()
            for _ in range(samples):
                if len(rtts) >= 3 and time.perf_counter() - start > max_s:
                    break
                t0 = time.perf_counter()
                c.sendall(b"x")
                if not c.recv(16):
                    raise ConnectionError("echo server closed early")
                rtts.append((time.perf_counter() - t0) * 1000)
            info = c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
            tcpi_rtt_ms = struct.unpack_from("I", info, _TCPI_RTT_OFFSET)[0] / 1000
    finally:
        lst.close()
        t.join(timeout)
    return tcpi_rtt_ms, min(rtts), statistics.median(rtts)


def _throughput(sender_netns: str | None, receiver_netns: str | None, addr: str,
                duration_s: float, timeout: float, receiver_listens: bool) -> float:
    """Goodput (kbit/s) of a bulk transfer sender -> receiver for ``duration_s``."""
    listen_ns = receiver_netns if receiver_listens else sender_netns
    connect_ns = sender_netns if receiver_listens else receiver_netns
    other, accepted = _connected_pair(listen_ns, connect_ns, addr, timeout)
    snd, rcv = (other, accepted) if receiver_listens else (accepted, other)
    sender = threading.Thread(target=_send_bulk, args=(snd, timeout), daemon=True)
    sender.start()
    try:
        return _receive_rate_kbit(rcv, duration_s)
    finally:
        rcv.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        rcv.close()  # RST: the sender's pending data is dropped, it stops at once
        sender.join(timeout)
        snd.close()


def _connected_pair(listen_ns: str | None, connect_ns: str | None, addr: str,
                    timeout: float) -> tuple[socket.socket, socket.socket]:
    """A TCP connection from ``connect_ns`` to a listener in ``listen_ns`` on ``addr``:
    (the connecting end, the accepted end). Raises ``ConnectionError`` when nothing was
    accepted within ``timeout``, ``OSError`` when the connect fails."""
    lst = _listener(listen_ns, addr)
    lst.settimeout(timeout)
    conns: list[socket.socket] = []

    def accept() -> None:
        try:
            conns.append(lst.accept()[0])
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    other = _connect(connect_ns, lst.getsockname(), timeout)
    t.join(timeout)
    lst.close()
    if not conns:
        other.close()
        raise ConnectionError("bulk transfer: no connection accepted")
    return other, conns[0]


def _send_bulk(s: socket.socket, timeout: float) -> None:
    """Send zeros on ``s`` until the receiver closes it."""
    chunk = b"\0" * 65536
    # A deep send buffer keeps the link busy while this thread waits for the CPU (the
    # autotuned one holds ~2 cwnd: on a loaded machine a 1000 kbit/s link then idled, 582).
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 2 * 1024 * 1024)
    s.settimeout(timeout)
    try:
        while True:
            s.sendall(chunk)
    except OSError:
        pass  # the receiver closed: done


def _receive_rate_kbit(s: socket.socket, duration_s: float) -> float:
    """Read ``s`` for ``duration_s`` and return the rate data segments reached it at (kbit/s,
    payload: segments x MSS), the least-squares slope over the second half of the window.
    Raises ``ConnectionError`` with fewer than 3 samples in that half."""
    # Samples pair a timestamp with the kernel's count of data segments that reached the
    # socket (tcpi_data_segs_in, retransmissions and out-of-order ones included), not with
    # bytes read or delivered in order: a tbf queue overflow makes the in-order byte count
    # stall for an RTO and then jump (measured: nothing for 0.3-0.6 s, then 63-66 kB at
    # once, on a 1000 kbit/s tbf), while segments keep arriving at the link's pace.
    s.settimeout(None)
    s.setblocking(False)
    marks: list[tuple[float, int]] = []
    mss = 0
    eof = False
    start = time.perf_counter()
    while True:
        ready, _, _ = select.select([s], [], [], 0.02)
        if ready:
            try:
                while s.recv(262144):
                    pass
                eof = True  # the sender went away
                break
            except BlockingIOError:
                pass
        now = time.perf_counter()
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        mss = max(mss, struct.unpack_from("I", info, _TCPI_RCV_MSS_OFFSET)[0])
        marks.append((now, struct.unpack_from("I", info, _TCPI_DATA_SEGS_IN_OFFSET)[0]))
        if now - start >= duration_s:
            break
    # The second half of the window (slow start is over by then: the window is at least 8
    # RTTs long, see measure_link): least-squares slope of segments over time.
    tail = [(t, n) for t, n in marks if t >= start + duration_s / 2]
    if len(tail) < 3:
        raise ConnectionError(
            f"bulk transfer: {len(tail)} samples in the second half of the window "
            f"({len(marks)} in all, {time.perf_counter() - start:.2f} s of {duration_s:.2f} s"
            f"{', the sender closed early' if eof else ''})"
        )
    slope = float(np.polyfit([t for t, _ in tail], [n for _, n in tail], 1)[0])
    return slope * mss * 8 / 1000


def _loss(sender_netns: str | None, receiver_netns: str | None, receiver_addr: str,
          packets: int, pps: float, drain_s: float) -> float:
    rx = _listener(receiver_netns, receiver_addr, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * 1024 * 1024)
    tx = socket_in(sender_netns, socket.AF_INET, socket.SOCK_DGRAM)
    seen: set[int] = set()
    last_arrival = [time.perf_counter()]
    stop = threading.Event()

    def receive() -> None:
        rx.settimeout(0.05)
        while not stop.is_set():
            try:
                data = rx.recv(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            if len(data) >= 4:
                seen.add(struct.unpack_from("!I", data)[0])
                last_arrival[0] = time.perf_counter()

    t = threading.Thread(target=receive, daemon=True)
    t.start()
    dest = rx.getsockname()
    pad = b"\0" * (_UDP_PAYLOAD - 4)
    start = time.perf_counter()
    try:
        for i in range(packets):
            due = start + i / pps
            delay = due - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                tx.sendto(struct.pack("!I", i) + pad, dest)
            except OSError:  # EPERM: dropped by a netfilter rule on the way out; counted lost
                pass
        # Wait for stragglers until none has come for drain_s (a late packet is not lost).
        end = time.perf_counter()
        while len(seen) < packets:
            now = time.perf_counter()
            if now - max(last_arrival[0], end) > drain_s:
                break
            time.sleep(0.02)
    finally:
        stop.set()
        t.join(1)
        tx.close()
        rx.close()
    return 100.0 * (packets - len(seen)) / packets


def measure_link(
    *,
    client_netns: str | None,
    server_netns: str | None,
    server_addr: str,
    client_addr: str,
    profile: LinkProfile | None = None,
    duration_s: float = 2.0,
    rtt_samples: int = 20,
    udp_packets: int = 1000,
    max_pps: float = 2000.0,
    max_phase_s: float = 4.0,
    timeout_s: float = 15.0,
    throughput: bool = True,
    loss: bool = True,
) -> LinkMeasurement:
    """Measure the link between ``client_netns`` (``client_addr``) and ``server_netns``
    (``server_addr``) as described in the module doc.

    ``profile`` (the requested one, optional) only sets the UDP pacing: at most a quarter of the
    slower direction's ``rate_kbit``, and at most ``max_pps``. The RTT round trips (at least 3)
    and each direction's UDP datagrams (at least 100) are cut to what fits in ``max_phase_s``, so a
    slow link (EDGE: 650 ms RTT, 59 datagrams/s) is probed in bounded time; the count used is in
    the result. Returns a :class:`LinkMeasurement`; raises ``OSError``/``ConnectionError`` when
    the path does not carry traffic at all (the RTT phase or the UDP phase fails); a failed bulk
    transfer leaves its figure None with the reason in ``errors``.
    """
    rtt_ms, app_min, app_p50 = _rtt(client_netns, server_netns, server_addr, rtt_samples,
                                    timeout_s, max_phase_s)
    down = up = down_loss = up_loss = None
    window_s = max(duration_s, 8 * rtt_ms / 1000)
    errors: list[str] = []
    if throughput:
        try:
            down = _throughput(server_netns, client_netns, server_addr, window_s, timeout_s,
                               receiver_listens=False)
        except OSError as e:
            errors.append(f"down throughput: {e}")
        try:
            up = _throughput(client_netns, server_netns, server_addr, window_s, timeout_s,
                             receiver_listens=True)
        except OSError as e:
            errors.append(f"up throughput: {e}")
    if loss:
        pps = max_pps
        rates = [d.rate_kbit for d in (profile.down, profile.up) if d.rate_kbit] if profile else []
        if rates:
            pps = min(pps, min(rates) * 1000 * 0.25 / _UDP_WIRE_BITS)
        udp_packets = min(udp_packets, max(100, int(pps * max_phase_s)))
        drain_s = 1.0 + 2 * rtt_ms / 1000
        down_loss = _loss(server_netns, client_netns, client_addr, udp_packets, pps, drain_s)
        up_loss = _loss(client_netns, server_netns, server_addr, udp_packets, pps, drain_s)
    return LinkMeasurement(
        rtt_ms=rtt_ms, app_rtt_min_ms=app_min, app_rtt_p50_ms=app_p50, down_kbit=down, up_kbit=up,
        down_loss_pct=down_loss, up_loss_pct=up_loss, udp_packets=udp_packets if loss else 0,
        duration_s=window_s if throughput else 0.0, errors=tuple(errors),
    )
