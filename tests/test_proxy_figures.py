"""A proxy's own figures and its hops' summaries: each kind's metric declaration read from
exposition text as the gateways serve it (Traefik 3.7, LiteLLM 1.108, the egress buffer), the
rise of a counter a gateway exports only once it has counted, the per-hop summary of a small
``proxy.parquet`` (with and without its ``hop`` column), the probe settings a chain gives per
hop; and, with real sockets and a process, a hop's queues counted from its own sockets only."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis._proxy import counter_rise, hop_rows, hop_summaries, probe_rows
from harness.servers import PROXIES, ProxyFigure, make_proxy, read_proxy_figures
from harness.servers._egress import EGRESS_FIGURES
from harness.servers._litellm import LITELLM_FIGURES
from harness.servers._traefik import TRAEFIK_FIGURES

TRAEFIK_TEXT = """# HELP traefik_entrypoint_requests_total How many HTTP requests processed.
# TYPE traefik_entrypoint_requests_total counter
traefik_entrypoint_requests_total{code="200",entrypoint="web",method="POST",protocol="http"} 6
traefik_entrypoint_requests_total{code="499",entrypoint="web",method="POST",protocol="http"} 2
traefik_entrypoint_requests_total{code="200",entrypoint="metrics",method="GET",protocol="http"} 40
# TYPE traefik_open_connections gauge
traefik_open_connections{entrypoint="metrics",protocol="TCP"} 1
traefik_open_connections{entrypoint="web",protocol="TCP"} 5
# TYPE traefik_service_requests_total counter
traefik_service_requests_total{code="200",method="POST",protocol="http",service="target@file"} 6
traefik_service_requests_total{code="499",method="POST",protocol="http",service="target@file"} 2
"""

LITELLM_TEXT = """# HELP litellm_proxy_total_requests_metric_total Total number of requests
# TYPE litellm_proxy_total_requests_metric_total counter
litellm_proxy_total_requests_metric_total{route="/v1/chat/completions",status_code="200"} 2.0
litellm_proxy_total_requests_metric_total{route="/v1/completions",status_code="200"} 4.0
litellm_proxy_total_requests_metric_created{route="/v1/completions",status_code="200"} 1.79e+09
# TYPE litellm_proxy_failed_requests_metric_total counter
# TYPE litellm_in_flight_requests gauge
litellm_in_flight_requests 3.0
"""

EGRESS_TEXT = """# TYPE zerowindow_egress_cuts counter
zerowindow_egress_cuts_total{reason="stall_timeout"} 2.0
zerowindow_egress_cuts_total{reason="overflow"} 1.0
# TYPE zerowindow_egress_buffered_bytes gauge
zerowindow_egress_buffered_bytes 4096.0
# TYPE zerowindow_egress_requests counter
zerowindow_egress_requests_total 7.0
"""


def test_traefik_counts_its_clients_entry_point_only():
    figures = read_proxy_figures(TRAEFIK_TEXT, TRAEFIK_FIGURES)
    # the metrics entry point's scrapes and connection are no client's
    assert figures == {"requests": 8.0, "service_requests": 8.0, "open_connections": 5.0}


def test_litellm_sums_over_labels_and_a_counter_not_yet_counted_is_absent():
    figures = read_proxy_figures(LITELLM_TEXT, LITELLM_FIGURES)
    assert figures == {"requests": 6.0, "in_flight_requests": 3.0}  # _created is no count


def test_egress_cuts_are_read_in_all_and_by_reason():
    figures = read_proxy_figures(EGRESS_TEXT, EGRESS_FIGURES)
    assert figures["cuts"] == 3 and figures["cuts_stall_timeout"] == 2
    assert figures["cuts_overflow"] == 1
    assert figures["buffered_bytes"] == 4096 and figures["requests"] == 7
    assert "upstream_aborts" not in figures  # not in the text: absent, never 0


def test_a_new_figure_is_one_declaration_and_text_that_is_no_exposition_is_an_error():
    mine = (ProxyFigure("requests_2xx", "traefik_entrypoint_requests_total", "counter",
                        labels=(("entrypoint", "web"), ("code", "200"))),)  # fmt: skip
    assert read_proxy_figures(TRAEFIK_TEXT, mine) == {"requests_2xx": 6.0}
    with pytest.raises(ValueError):
        read_proxy_figures("<html>not metrics</html>", TRAEFIK_FIGURES)


def test_a_counter_absent_from_an_answer_counted_zero_there():
    rows = [
        {"t": 0.0, "metrics_ok": True},  # the gateway had counted nothing yet
        {"t": 0.1, "metrics_ok": False},  # no answer: says nothing
        {"t": 0.2, "metrics_ok": True, "requests": 3.0},
        {"t": 0.3, "metrics_ok": True, "requests": 8.0},
    ]
    assert counter_rise(rows, "requests") == 8.0
    assert counter_rise(rows[2:], "requests") == 5.0
    assert counter_rise(rows, "failed_requests") is None  # never served: not observed


def _hops() -> list[dict]:
    traefik = [f.describe() for f in TRAEFIK_FIGURES]
    return [
        {"index": 0, "kind": "traefik", "port": 8000, "metric_figures": traefik},
        {"index": 1, "kind": "nginx", "port": 8001, "metric_figures": []},
    ]


def test_hop_summaries_from_a_small_proxy_table():
    frame = pd.DataFrame([
        {"t": 0.0, "hop": 0, "rss_bytes": 100, "client_send_q_bytes": 0,
         "upstream_recv_q_bytes": 0, "metrics_ok": True, "requests": 1.0,
         "open_connections": 1.0},
        {"t": 0.0, "hop": 1, "rss_bytes": 50, "client_send_q_bytes": 10,
         "upstream_recv_q_bytes": 5, "buffered_bytes": 0},
        {"t": 0.5, "hop": 0, "rss_bytes": 300, "client_send_q_bytes": 900,
         "upstream_recv_q_bytes": 20, "metrics_ok": True, "requests": 9.0,
         "open_connections": 4.0},
        {"t": 0.5, "hop": 1, "rss_bytes": 40, "client_send_q_bytes": 70,
         "upstream_recv_q_bytes": 3, "buffered_bytes": 8192},
    ])  # fmt: skip
    sockets = pd.DataFrame({
        "t": [0.0, 0.0, 0.5, 0.5], "local_port": [8000, 8000, 8001, 8001],
        "send_q_bytes": [100, 200, 30, 40],
    })  # fmt: skip
    rows = probe_rows(frame)
    assert "buffered_bytes" not in hop_rows(rows, 0)[0]  # the NaN of another hop's column
    first, second = hop_summaries(sockets, _hops(), rows)
    assert (first.index, first.kind, first.port) == (0, "traefik", 8000)
    assert (first.rss_peak_bytes, first.client_send_q_peak_bytes) == (300, 900)
    assert first.upstream_recv_q_peak_bytes == 20 and first.buffered_peak_bytes is None
    assert first.metrics == {"requests": 8.0, "open_connections_peak": 4.0}
    assert first.send_q_peak_bytes == 300 and first.samples == 1 and first.probe_samples == 2
    assert (second.rss_peak_bytes, second.buffered_peak_bytes) == (50, 8192)
    assert (second.client_send_q_peak_bytes, second.upstream_recv_q_peak_bytes) == (70, 5)
    assert second.metrics == {} and second.send_q_peak_bytes == 70


def test_a_proxy_table_without_hops_is_the_first_hops():
    # written when only the first hop was probed: no hop column, no metrics_ok
    frame = pd.DataFrame([
        {"t": 0.0, "rss_bytes": 10, "client_send_q_bytes": 0, "upstream_recv_q_bytes": 0},
        {"t": 0.5, "rss_bytes": 30, "client_send_q_bytes": 7, "upstream_recv_q_bytes": 1},
    ])  # fmt: skip
    old_hops = [{"kind": "traefik", "port": 8000}, {"kind": "nginx", "port": 8001}]
    empty = pd.DataFrame(columns=["t", "local_port", "send_q_bytes"])
    first, second = hop_summaries(empty, old_hops, probe_rows(frame))
    assert first.rss_peak_bytes == 30 and first.probe_samples == 2 and first.metrics == {}
    assert second.rss_peak_bytes is None and second.probe_samples == 0
    assert first.send_q_peak_bytes is None and first.samples == 0


def test_a_chain_gives_each_hop_its_ports_and_folder_and_a_single_proxy_is_hop_0(tmp_path):
    chain = make_proxy(PROXIES.get("chain")(hops=[{"kind": "traefik"}, {"kind": "nginx"}]))
    chain.urls = ["http://127.0.0.1:8000", "http://127.0.0.1:8001"]  # as start() leaves them
    first, second = chain.probe_hops(tmp_path, chain.urls[0], "http://127.0.0.1:9000")
    assert (first.index, first.kind, first.listen_port, first.upstream_port) == (
        0, "traefik", 8000, 8001,
    )  # fmt: skip
    assert first.metrics_url is not None and first.figures == TRAEFIK_FIGURES
    assert (second.index, second.listen_port, second.upstream_port) == (1, 8001, 9000)
    assert second.spill_dir == Path(tmp_path / "hops" / "1-nginx" / "nginx" / "proxy_temp")
    assert second.metrics_url is None and second.pid is None  # not started
    described = first.describe()
    assert described["port"] == 8000 and described["metric_figures"][0]["figure"] == "requests"
    single = make_proxy(PROXIES.get("traefik")())
    (only,) = single.probe_hops(tmp_path, "http://127.0.0.1:8000", "http://127.0.0.1:9000")
    assert (only.index, only.listen_port, only.upstream_port) == (0, 8000, 9000)
    assert make_proxy(PROXIES.get("none")()).probe_hops(tmp_path, "u", "u") == []


HOP = """
import socket, sys, time
upstream = socket.create_connection(("127.0.0.1", int(sys.argv[1])))  # never read
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
print(listener.getsockname()[1], flush=True)
client, _ = listener.accept()
client.setblocking(False)
try:
    while True:
        client.send(b"x" * 65536)
except BlockingIOError:
    pass
time.sleep(60)
"""


def test_a_hop_counts_only_the_sockets_its_own_processes_hold():
    """A hop (a process of its own) forwards to an upstream listener in this process; this
    process also connects to that upstream itself and reads nothing: its Recv-Q is not the
    hop's."""
    import socket
    import subprocess
    import sys
    import time

    from harness.collectors import ProxyProbe
    from harness.servers import ProxyHop

    upstream = socket.create_server(("127.0.0.1", 0))
    up_port = upstream.getsockname()[1]
    hop = subprocess.Popen([sys.executable, "-c", HOP, str(up_port)], stdout=subprocess.PIPE)
    sockets: list[socket.socket] = [upstream]
    try:
        to_hop, _ = upstream.accept()
        foreign = socket.create_connection(("127.0.0.1", up_port))  # not the hop's
        to_foreign, _ = upstream.accept()
        to_hop.sendall(b"u" * 1000)  # waits unread in the hop's upstream socket
        to_foreign.sendall(b"f" * 5000)  # waits unread in this process's own socket
        assert hop.stdout is not None
        listen_port = int(hop.stdout.readline())
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", listen_port))  # reads nothing: the hop's Send-Q fills
        sockets += [to_hop, foreign, to_foreign, client]
        time.sleep(0.5)
        probe = ProxyProbe(
            ProxyHop(index=1, kind="x", pid=hop.pid, listen_port=listen_port,
                     upstream_port=up_port),
        )  # fmt: skip
        probe.sample()
        (row,) = probe.rows
        assert row["hop"] == 1 and row["rss_bytes"] > 0
        assert row["upstream_recv_q_bytes"] == 1000, row
        assert row["client_send_q_bytes"] > 4096, row
    finally:
        hop.kill()
        hop.wait()
        for s in sockets:
            s.close()


def test_the_hops_probes_share_one_read_of_a_namespaces_socket_table():
    from harness.collectors import SocketTables

    tables = SocketTables(max_age_s=60.0)
    first = tables.sockets("/proc/self")
    assert tables.sockets(f"/proc/{os.getpid()}") is first  # same namespace, read once
    assert SocketTables(max_age_s=0.0).sockets("/proc/self") is not first
    assert tables.sockets("/proc/999999999") == []  # a process that is gone


def test_a_comparison_prints_the_hops_of_its_chains_only() -> None:
    from types import SimpleNamespace

    from rich.console import Console

    from harness.outputs import print_hops
    from harness.runfolder import HopSummary

    def hop(i: int, kind: str) -> HopSummary:
        return HopSummary(index=i, kind=kind, port=8000 + i, send_q_peak_bytes=0, samples=1,
                          rss_peak_bytes=10**7, metrics={"requests": 4.0})  # fmt: skip

    runs = {
        "nginx": SimpleNamespace(proxy=SimpleNamespace(hops=[hop(0, "nginx")])),
        "none": SimpleNamespace(proxy=None),
        "edge": SimpleNamespace(proxy=SimpleNamespace(hops=[hop(0, "traefik"), hop(1, "litellm")])),
    }
    console = Console(record=True, width=200)
    print_hops(runs, console)  # type: ignore[arg-type]
    text = console.export_text()
    assert text.count("proxy hops") == 1 and "edge: proxy hops" in text
    assert "traefik" in text and "litellm" in text and "requests 4" in text


def test_the_names_offered_for_gates_are_the_names_a_run_gives() -> None:
    from harness.analysis._proxy import metric_figures
    from harness.servers import hop_metric_names

    # egress's buffered_bytes gauge feeds the probe's own column (buffered_peak_bytes), so a
    # gate on a "buffered_bytes_peak" metric would never be measured: it is not offered
    rows = [{"t": 0.0, "hop": 0, "buffered_bytes": 5.0, "requests": 1.0, "active_streams": 2.0},
            {"t": 1.0, "hop": 0, "buffered_bytes": 9.0, "requests": 4.0, "active_streams": 1.0}]
    given = metric_figures(rows, [f.describe() for f in EGRESS_FIGURES])
    assert given["requests"] == 3.0 and given["active_streams_peak"] == 2.0
    offered = hop_metric_names("egress")
    assert set(given) <= set(offered) and "buffered_bytes_peak" not in offered
