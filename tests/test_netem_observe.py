"""inet_diag socket observation, its join to requests, and the scenario's network tables."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pandas as pd
import pytest

from harness.analysis._tables import _server_socket_figures
from harness.collectors._collectors import SOCKET_COLUMNS, SocketSampler
from harness.lifecycle import run_scenario
from harness.scenario import ScenarioError, parse_scenario
from netem import tcp_connections


def _stalled_pair() -> tuple[socket.socket, socket.socket, socket.socket, int]:
    """A loopback connection whose client never reads: the server fills its send buffer."""
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    client.connect(("127.0.0.1", port))
    conn, _ = server.accept()
    conn.setblocking(False)
    try:
        while True:
            conn.send(b"x" * 65536)
    except BlockingIOError:
        pass
    return server, client, conn, port


def test_inet_diag_reports_the_kernels_rwnd_limited_time_of_a_stalled_connection():
    server, client, conn, port = _stalled_pair()
    try:
        time.sleep(0.6)
        (c,) = tcp_connections({port})
        assert c.state == "ESTABLISHED"
        assert c.remote_port == client.getsockname()[1]
        assert c.send_q_bytes > 10_000
        assert c.snd_wnd_bytes == 0  # the client advertises a zero window
        assert c.rwnd_limited_ms is not None and c.rwnd_limited_ms >= 400
        assert c.rtt_ms is not None and c.rtt_ms >= 0
    finally:
        for s in (conn, client, server):
            s.close()


def test_socket_sampler_rows_have_the_documented_columns():
    server, client, conn, port = _stalled_pair()
    sampler = SocketSampler({port}, interval_s=0.05)
    try:
        sampler.start()
        deadline = time.monotonic() + 15  # a busy machine: give the thread time
        while len(sampler.rows) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sampler.stop()
        for s in (conn, client, server):
            s.close()
    assert sampler.last_error is None
    frame = pd.DataFrame(sampler.rows, columns=SOCKET_COLUMNS)
    assert len(frame) >= 5 and set(frame.columns) == set(sampler.rows[0])
    assert (frame["local_port"] == port).all()
    assert frame["rwnd_limited_ms"].is_monotonic_increasing
    assert frame["rwnd_limited_ms"].iloc[-1] > frame["rwnd_limited_ms"].iloc[0]


def test_requests_get_the_figures_of_their_own_connection_in_their_own_time():
    requests = pd.DataFrame(
        {
            "request_id": ["a", "b", "c"],
            "client_addr": ["10.0.0.1", "10.0.0.1", "10.0.0.2"],
            "client_port": [5000, 5000, 5000],  # b reuses a's port later
            "t_send": [0.0, 100.0, 0.0],
            "t_end": [10.0, 110.0, None],
        }
    )
    sockets = pd.DataFrame(
        {
            "t": [1.0, 9.0, 101.0, 105.0, 5.0],
            "client_addr": ["10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.1", "10.0.0.2"],
            "client_port": [5000] * 5,
            "send_q_bytes": [100, 5000, 10, 20, 7],
            "rwnd_limited_ms": [0.0, 8000.0, 0.0, 3.0, 1.0],
            "sndbuf_limited_ms": [0.0] * 5,
            "retransmits": [0, 1, 0, 0, 0],
        }
    )
    out = _server_socket_figures(requests, sockets).set_index("request_id")
    assert out.loc["a", "server_rwnd_limited_ms"] == 8000
    assert out.loc["a", "server_send_q_peak_bytes"] == 5000
    assert out.loc["b", "server_rwnd_limited_ms"] == 3
    assert out.loc["b", "server_send_q_peak_bytes"] == 20
    assert out.loc["c", "server_rwnd_limited_ms"] == 1  # no end: samples after its send count


BASE = """
name = "n"
[target]
kind = "sim"
[[groups]]
name = "slow"
users = 1
requests_per_user = 1
"""


def test_unknown_network_profile_is_named_with_the_valid_ones_at_its_line(tmp_path: Path):
    text = BASE + 'network_profile = "5g"\n'
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, path=tmp_path / "s.toml")
    message = str(err.value)
    line = text.splitlines().index('network_profile = "5g"') + 1
    assert f"s.toml:{line}: field 'groups.0.network_profile'" in message
    assert "unknown network_profile '5g'" in message
    assert "3g" in message and "none" in message


def test_scenario_profiles_and_server_net_validate(tmp_path: Path):
    text = (
        BASE
        + 'network_profile = "my-link"\n'
        + (
            '[netem.profiles.my-link]\npreset = "3g"\ndown = { loss_pct = 2 }\n'
            "[server_net]\ntcp_wmem = [4096, 16384, 65536]\n"
        )
    )
    scenario = parse_scenario(text, path=tmp_path / "s.toml")
    assert scenario.needs_topology()
    assert scenario.server_net is not None
    assert scenario.server_net.sysctls() == {"net.ipv4.tcp_wmem": "4096 16384 65536"}
    bad = text.replace("loss_pct = 2", "loss_pct = 200").replace("16384, 65536", "1, 65536")
    with pytest.raises(ScenarioError) as err:
        parse_scenario(bad, path=tmp_path / "s.toml")
    assert "netem.profiles.my-link" in str(err.value) and "loss_pct" in str(err.value)
    assert "server_net.tcp_wmem" in str(err.value)


def test_a_url_target_cannot_be_moved_into_the_server_namespace(tmp_path: Path):
    scenario = parse_scenario(BASE + 'network_profile = "3g"\n', path=tmp_path / "s.toml")
    with pytest.raises(ScenarioError, match="--target-url"):
        run_scenario(scenario, out_root=tmp_path, target_url="http://127.0.0.1:9")
    assert not list(tmp_path.glob("n/*"))  # nothing started, no run folder
