"""Wire capture on an interface inside a namespace, and its TCP analysis for ``wire.parquet``.

:class:`WireCapture` runs ``tcpdump`` (Debian package tcpdump) in the namespace, writing TCP
headers only (snap length 128 bytes) to a pcap file in the run folder. :func:`wire_events` reads
the pcap with scapy and returns one row per event of interest; :func:`stalled_flows` reduces
those to one row per flow that saw a zero window: how long from its first zero window to the RST,
and who sent the RST.

Events (``event`` column), each with its direction:

* ``syn``: the connection's SYN (tells the client from the server);
* ``zero_window``: a segment advertising a receive window of 0 (RFC 9293 3.8.6.1);
* ``window_probe``: a zero-window probe: while the peer's last advertised window is 0, a segment
  with ``seq == peer's ack - 1`` and no payload (Linux, ``tcp_xmit_probe_skb``) or with one byte
  at ``seq == peer's ack`` (RFC 9293's one-octet probe);
* ``window_open``: the first segment with a non-zero window after a zero window from that side;
* ``fin``, ``rst``.

Client and server: the sender of the SYN without ACK is the client. For a flow whose handshake was
not captured, the endpoint with the lower port is taken as the server.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from netem._errors import CaptureError
from netem._nsexec import netns_path, ns_argv

EVENT_COLUMNS = [
    "time_s", "flow", "client_addr", "client_port", "server_addr", "server_port",
    "sender", "event", "window", "seq", "ack", "payload_bytes",
]  # fmt: skip
_PR_SET_PDEATHSIG = 1


_prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before any fork


def _die_with_parent() -> None:  # runs in the child between fork and exec: no imports, no locks
    _prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


@dataclass
class WireCapture:
    """A running tcpdump on ``ifname`` in ``netns`` writing ``pcap_path``.

    ``start()`` returns once tcpdump is listening (raises :class:`CaptureError` otherwise);
    ``stop()`` (idempotent) ends it with SIGINT so it flushes the file. tcpdump is told to die
    with the thread that started it (PR_SET_PDEATHSIG), so a killed harness leaves none: call
    ``start()`` from a thread that lives as long as the capture (e.g. the main thread).
    """

    netns: str | None
    ifname: str
    pcap_path: Path
    bpf_filter: str = "tcp"
    snaplen: int = 128
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def start(self, timeout_s: float = 10.0) -> WireCapture:
        if self.netns:
            netns_path(self.netns)
        self.pcap_path.parent.mkdir(parents=True, exist_ok=True)
        argv = ns_argv(self.netns, [
            "tcpdump", "-i", self.ifname, "-w", str(self.pcap_path), "-U", "-n",
            "-s", str(self.snaplen), *self.bpf_filter.split(),
        ])
        try:
            self._proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                          preexec_fn=_die_with_parent)
        except FileNotFoundError as e:
            raise CaptureError("tcpdump is not installed (Debian package tcpdump)") from e
        assert self._proc.stderr is not None
        ready, _, _ = select.select([self._proc.stderr], [], [], timeout_s)
        line = self._proc.stderr.readline().decode(errors="replace") if ready else ""
        if "listening on" not in line:
            self.stop()
            raise CaptureError(f"tcpdump on {self.ifname} ({self.netns or 'host'}) did not "
                               f"start: {line.strip() or 'no output'}")
        return self

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def stop(self, timeout_s: float = 5.0) -> Path:
        p, self._proc = self._proc, None
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGINT)
            try:
                p.wait(timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if p is not None and p.stderr is not None:
            p.stderr.close()
        return self.pcap_path

    def __enter__(self) -> WireCapture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class _Flow:
    client: tuple[str, int]
    server: tuple[str, int]
    window: dict[str, int] = field(default_factory=dict)  # side -> last advertised window
    ack: dict[str, int] = field(default_factory=dict)  # side -> last ack number sent


def _key(a: tuple[str, int], b: tuple[str, int]) -> tuple[tuple[str, int], tuple[str, int]]:
    return (a, b) if a <= b else (b, a)


def wire_events(pcap_path: str | os.PathLike[str]) -> pd.DataFrame:
    """Events of every TCP flow in the pcap (see module doc), one row each, time-ordered.

    Columns: ``time_s`` (capture timestamp, s since the epoch), ``flow`` (``"client_addr:port >
    server_addr:port"``), ``client_addr``, ``client_port``, ``server_addr``, ``server_port``,
    ``sender`` (``"client"``/``"server"``), ``event``, ``window`` (raw, unscaled), ``seq``,
    ``ack``, ``payload_bytes``.
    """
    from scapy.layers.inet import IP, TCP
    from scapy.layers.inet6 import IPv6
    from scapy.utils import PcapReader

    flows: dict[tuple[tuple[str, int], tuple[str, int]], _Flow] = {}
    rows: list[dict[str, Any]] = []
    with PcapReader(str(pcap_path)) as reader:
        for pkt in reader:
            ip = pkt.getlayer(IP) or pkt.getlayer(IPv6)
            tcp = pkt.getlayer(TCP)
            if ip is None or tcp is None:
                continue
            src, dst = (ip.src, int(tcp.sport)), (ip.dst, int(tcp.dport))
            flags = int(tcp.flags)
            syn, ack_f, fin, rst = flags & 0x02, flags & 0x10, flags & 0x01, flags & 0x04
            key = _key(src, dst)
            flow = flows.get(key)
            if flow is None or (syn and not ack_f):
                if syn and not ack_f:
                    flow = _Flow(client=src, server=dst)
                else:  # handshake not captured: the lower port is the server's
                    client, server = (src, dst) if src[1] > dst[1] else (dst, src)
                    flow = _Flow(client=client, server=server)
                flows[key] = flow
            side = "client" if src == flow.client else "server"
            peer = "server" if side == "client" else "client"
            # Payload: IP length minus headers (the capture keeps headers only).
            ip_len = int(ip.len) if ip.haslayer(IP) else int(ip.plen) + 40
            ihl = int(ip.ihl) * 4 if ip.haslayer(IP) else 40
            payload = max(ip_len - ihl - int(tcp.dataofs) * 4, 0)
            seq, ack, win = int(tcp.seq), int(tcp.ack), int(tcp.window)
            base = {
                "time_s": float(pkt.time),
                "flow": f"{flow.client[0]}:{flow.client[1]} > {flow.server[0]}:{flow.server[1]}",
                "client_addr": flow.client[0], "client_port": flow.client[1],
                "server_addr": flow.server[0], "server_port": flow.server[1],
                "sender": side, "window": win, "seq": seq, "ack": ack, "payload_bytes": payload,
            }
            events: list[str] = []
            if syn and not ack_f:
                events.append("syn")
            if rst:
                events.append("rst")
            else:
                if flow.window.get(peer) == 0 and peer in flow.ack and (
                    (payload == 0 and seq == (flow.ack[peer] - 1) % 2**32)
                    or (payload == 1 and seq == flow.ack[peer])
                ):
                    events.append("window_probe")
                if win == 0 and not syn:
                    events.append("zero_window")
                elif flow.window.get(side) == 0 and win > 0:
                    events.append("window_open")
                if fin:
                    events.append("fin")
                flow.window[side] = win
                if ack_f:
                    flow.ack[side] = ack
            rows.extend({**base, "event": e} for e in events)
    df = pd.DataFrame(rows, columns=EVENT_COLUMNS)
    return df.sort_values("time_s", kind="stable").reset_index(drop=True)


STALL_COLUMNS = [
    "flow", "client_addr", "client_port", "server_addr", "server_port", "zero_window_by",
    "first_zero_window_s", "zero_windows", "window_probes", "window_reopened",
    "rst_s", "rst_by", "zero_window_to_rst_s", "fin_by",
]  # fmt: skip


def stalled_flows(events: pd.DataFrame) -> pd.DataFrame:
    """One row per flow with at least one zero window (columns :data:`STALL_COLUMNS`).

    ``zero_window_by``: who advertised the first zero window; ``zero_window_to_rst_s``: seconds
    from it to the flow's first RST after it (NaN when no RST was seen); ``rst_by`` and
    ``fin_by``: who sent the first RST / FIN (None if none); ``window_reopened``: whether that side
    advertised a non-zero window again.
    """
    out: list[dict[str, Any]] = []
    for flow, ev in events.groupby("flow", sort=False):
        zw = ev[ev.event == "zero_window"]
        if zw.empty:
            continue
        first = zw.iloc[0]
        after = ev[ev.time_s >= first.time_s]
        rst = after[after.event == "rst"]
        fin = ev[ev.event == "fin"]
        by = first.sender
        out.append({
            "flow": flow, "client_addr": first.client_addr, "client_port": first.client_port,
            "server_addr": first.server_addr, "server_port": first.server_port,
            "zero_window_by": by, "first_zero_window_s": float(first.time_s),
            "zero_windows": int(len(zw)),
            "window_probes": int((ev.event == "window_probe").sum()),
            "window_reopened": bool(((after.event == "window_open") & (after.sender == by)).any()),
            "rst_s": float(rst.iloc[0].time_s) if not rst.empty else float("nan"),
            "rst_by": rst.iloc[0].sender if not rst.empty else None,
            "zero_window_to_rst_s": (float(rst.iloc[0].time_s - first.time_s)
                                     if not rst.empty else float("nan")),
            "fin_by": fin.iloc[0].sender if not fin.empty else None,
        })
    return pd.DataFrame(out, columns=STALL_COLUMNS)


def write_wire_parquet(pcap_path: str | os.PathLike[str], out_path: str | os.PathLike[str]
                       ) -> pd.DataFrame:
    """Analyse ``pcap_path`` and write its events to ``out_path`` (``wire.parquet``)."""
    events = wire_events(pcap_path)
    events.to_parquet(out_path, index=False)
    return events
