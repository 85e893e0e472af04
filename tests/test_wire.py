"""Wire capture of a real stalled TCP connection: zero windows, probes, and the server's RST."""

from __future__ import annotations

import shutil
import socket
import struct
import time
from pathlib import Path

import pandas as pd
import pytest

from netem import WireCapture, socket_in, stalled_flows, wire_events, write_wire_parquet
from tests.netem_fixtures import ns_pair

STALL_S = 1.5


def test_stalled_flow_zero_window_probes_and_rst_seen_on_the_wire(tmp_path: Path):
    if shutil.which("tcpdump") is None:
        pytest.skip("needs tcpdump (Debian package tcpdump)")
    with ns_pair() as pair:
        pcap = tmp_path / "wire.pcap"
        with WireCapture(pair.client_ns, pair.client_if, pcap):
            lst = socket_in(pair.server_ns)
            lst.bind((pair.server_addr, 0))
            lst.listen(1)
            client = socket_in(pair.client_ns)
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect
            client.connect(lst.getsockname())
            client_port = client.getsockname()[1]
            server, _ = lst.accept()
            server.settimeout(0.3)
            sent = 0
            try:  # the client never reads: the server's writes stop when its window is 0
                while True:
                    sent += server.send(b"x" * 65536)
            except TimeoutError:
                pass
            time.sleep(STALL_S)  # zero-window probes back off from the RTO (~200 ms)
            server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            t_rst = time.time()
            server.close()  # abortive close: RST
            time.sleep(0.3)
            client.close()
            lst.close()
        events = wire_events(pcap)
        out = tmp_path / "wire.parquet"
        write_wire_parquet(pcap, out)
        assert pd.read_parquet(out).equals(events)

    flow = f"{pair.client_addr}:{client_port} > {pair.server_addr}:{lst_port(events)}"
    ev = events[events.flow == flow]
    assert (ev.event == "syn").sum() == 1 and ev[ev.event == "syn"].sender.iloc[0] == "client"
    zw = ev[ev.event == "zero_window"]
    assert len(zw) >= 2 and set(zw.sender) == {"client"}
    probes = ev[ev.event == "window_probe"]
    assert len(probes) >= 2 and set(probes.sender) == {"server"}
    rst = ev[ev.event == "rst"]
    assert list(rst.sender[:1]) == ["server"]
    assert abs(rst.time_s.iloc[0] - t_rst) < 0.5

    stalls = stalled_flows(events)
    assert list(stalls.flow) == [flow]
    s = stalls.iloc[0]
    assert s.zero_window_by == "client" and s.rst_by == "server" and not s.window_reopened
    assert s.window_probes == len(probes) and s.zero_windows == len(zw)
    # the window closed within the first writes, so the stall lasted about STALL_S
    assert STALL_S - 0.1 <= s.zero_window_to_rst_s <= STALL_S + 1.0, s
    assert sent > 4096


def lst_port(events: pd.DataFrame) -> int:
    return int(events.server_port.iloc[0])


def test_flow_without_handshake_takes_the_lower_port_as_server(tmp_path: Path):
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether
    from scapy.utils import wrpcap

    pkts = [
        Ether() / IP(src="198.18.0.1", dst="198.18.0.2") / TCP(sport=40000, dport=8000,
                                                                flags="A", window=0, ack=100),
        Ether() / IP(src="198.18.0.2", dst="198.18.0.1") / TCP(sport=8000, dport=40000,
                                                                flags="A", seq=99, window=500),
        Ether() / IP(src="198.18.0.1", dst="198.18.0.2") / TCP(sport=40000, dport=8000,
                                                                flags="R", seq=1),
    ]
    for i, p in enumerate(pkts):
        p.time = 1000.0 + i
    wrpcap(str(tmp_path / "x.pcap"), pkts)
    ev = wire_events(tmp_path / "x.pcap")
    assert list(ev.event) == ["zero_window", "window_probe", "rst"]
    assert list(ev.sender) == ["client", "server", "client"]
    assert ev.server_port.iloc[0] == 8000
    s = stalled_flows(ev).iloc[0]
    assert s.rst_by == "client" and s.zero_window_to_rst_s == pytest.approx(2.0)
