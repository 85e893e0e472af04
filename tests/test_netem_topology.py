"""The run's network topology, its state file and clean-up, on real namespaces and veth links.

Needs CAP_NET_ADMIN (CI runs as root); every test that creates namespaces skips without it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyroute2 import IPRoute

from harness.lifecycle._netrun import RunNetwork
from harness.scenario import load_scenario
from netem import NetemPermissionError, NetemState, Topology, clean, has_net_admin, read_state
from netem._netns import create_netns, list_netns, netns_pids, run_in_netns
from tests.conftest import REPO, run_cli

needs_net_admin = pytest.mark.skipif(
    not has_net_admin(), reason="needs the CAP_NET_ADMIN capability (run as root)"
)


def host_snapshot() -> dict[str, Any]:
    """The host namespace's interfaces, addresses, routes and qdiscs, minus those of the
    toolkit (``zw-`` names) and of concurrently running tests' own namespaces."""
    with IPRoute() as ipr:
        links = {
            link["index"]: link.get("ifname")
            for link in ipr.get_links()
            if not (link.get("ifname") or "").startswith("zw-")
        }
        addrs = sorted(
            (a["index"], str(a.get("IFA_ADDRESS")), a["prefixlen"])
            for a in ipr.get_addr()
            if a["index"] in links
        )
        routes = sorted(
            tuple(
                str(v)
                for v in (r.get("RTA_DST"), r["dst_len"], r.get("RTA_GATEWAY"), r.get("RTA_OIF"))
            )
            for r in ipr.get_routes(family=socket.AF_INET)
            if r.get("RTA_OIF") in links
        )
        qdiscs = sorted(
            (q["index"], str(q.get("TCA_KIND")), q["handle"], q["parent"])
            for q in ipr.get_qdiscs()
            if q["index"] in links
        )
    return {"links": links, "addrs": addrs, "routes": routes, "qdiscs": qdiscs}


def run_leftovers(run_id: str) -> dict[str, list[Any]]:
    """Everything named after run ``run_id`` that still exists."""
    prefix = f"zw-{run_id}-"
    with IPRoute() as ipr:
        links = [x.get("ifname") for x in ipr.get_links() if x.get("ifname", "").startswith(prefix)]
    return {"netns": [n for n in list_netns() if n.startswith(prefix)], "links": links}


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    return tmp_path


@needs_net_admin
def test_topology_joins_groups_to_the_server_and_leaves_the_host_unchanged(state_dir: Path):
    before = host_snapshot()
    run_id = os.urandom(3).hex()
    state = NetemState(state_dir, run_id)
    topo = Topology(
        run_id,
        ["fast", "slow"],
        state=state,
        server_sysctls={"net.ipv4.tcp_wmem": "4096 8192 32768"},
    )
    try:
        topo.create()
        assert all(len(name) <= 15 for name in (topo.host_ifname, topo.host_peer_ifname))
        recorded = [(r["kind"], r["name"]) for r in read_state(state.path)["resources"]]
        assert ("netns", topo.server_ns) in recorded and ("link", topo.host_ifname) in recorded
        # The server's sysctl is its own: the host keeps its value.
        assert topo.applied_sysctls == {"net.ipv4.tcp_wmem": "4096 8192 32768"}
        host_wmem = Path("/proc/sys/net/ipv4/tcp_wmem").read_text().split()
        assert host_wmem != ["4096", "8192", "32768"]
        listener = run_in_netns(topo.server_ns, lambda: socket.create_server((topo.server_addr, 0)))
        port = listener.getsockname()[1]
        seen = []
        for group, link in topo.links.items():
            client = run_in_netns(link.netns, lambda: socket.socket())
            client.settimeout(5)
            client.connect((topo.server_addr, port))
            conn, peer = listener.accept()
            seen.append(peer[0])
            assert peer[0] == link.client_addr, group
            conn.close()
            client.close()
        # The host reaches the server over its own link (health checks, /metrics).
        with socket.create_connection((topo.server_addr, port), timeout=5):
            conn, peer = listener.accept()
            assert peer[0] == topo.host_addr
            conn.close()
        listener.close()
        assert len(set(seen)) == 2
    finally:
        removed = topo.destroy()
        state.finish()
    assert any("netns" in r for r in removed)
    assert run_leftovers(run_id) == {"netns": [], "links": []}
    assert host_snapshot() == before


@needs_net_admin
def test_clean_finds_leftovers_by_prefix_and_kills_their_processes(state_dir: Path):
    run_id = os.urandom(3).hex()
    ns = f"zw-{run_id}-g0"
    create_netns(ns)
    with IPRoute() as ipr:
        ipr.link("add", ifname=f"zw-{run_id}-h", kind="veth", peer={"ifname": f"zw-{run_id}-x"})
    sleeper = subprocess.Popen(["ip", "netns", "exec", ns, "sleep", "300"])
    try:
        deadline = time.monotonic() + 5
        while not netns_pids(ns) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert netns_pids(ns) == [sleeper.pid]
        report = clean(results=None, run_id=run_id)
        assert sleeper.wait(timeout=5) == -9
        assert any(ns in r for r in report.removed)
        assert run_leftovers(run_id) == {"netns": [], "links": []}
    finally:
        sleeper.kill()
        clean(results=None, run_id=run_id)


@needs_net_admin
def test_clean_leaves_unrecorded_namespaces_alone_unless_asked(state_dir: Path):
    run_id = os.urandom(3).hex()  # a run no state file in state_dir knows: another job's?
    ns = f"zw-{run_id}-g0"
    create_netns(ns)
    try:
        report = clean(results=state_dir)
        assert ns in report.skipped_unrecorded and ns in list_netns()
        assert not any(ns in r for r in report.removed)
        report = clean(results=state_dir, unrecorded=True)
        assert any(ns in r for r in report.removed) and ns not in list_netns()
    finally:
        clean(results=None, run_id=run_id)


@needs_net_admin
def test_clean_leaves_a_live_run_alone(state_dir: Path):
    run_id = os.urandom(3).hex()
    state = NetemState(state_dir, run_id)  # owned by this (live) test process
    topo = Topology(run_id, ["g"], state=state)
    try:
        topo.create()
        report = clean(results=state_dir, run_id=run_id)
        assert report.skipped_live_runs == [run_id]
        assert len(run_leftovers(run_id)["netns"]) == 2
    finally:
        topo.destroy()
        state.finish()


def test_without_cap_net_admin_the_error_names_the_capability(tmp_path: Path):
    if not has_net_admin():
        with pytest.raises(NetemPermissionError, match="CAP_NET_ADMIN"):
            clean(results=None)
        return
    # As root: drop the capability for a child process (setpriv, util-linux).
    code = (
        "from netem._clean import clean\n"
        "from netem._netns import NetemPermissionError\n"
        "try:\n    clean(results=None)\nexcept NetemPermissionError as e:\n    print(e)\n"
    )
    out = subprocess.run(
        ["setpriv", "--inh-caps=-net_admin", "--bounding-set=-net_admin",
         sys.executable, "-c", code],
        capture_output=True, text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert "CAP_NET_ADMIN" in out.stdout, out.stderr


# -- a whole run ---------------------------------------------------------------------------

SHAPED_SIM = """
name = "shaped-sim"
max_duration_s = 90
cooldown_s = 0.5
[target]
kind = "sim"
[target.engine]
num_blocks = 256
block_size = 32
[netem]
measure_duration_s = 1.0
measure_udp_packets = 200
[server_net]
tcp_wmem = [4096, 16384, 65536]
[[groups]]
name = "fast"
users = 2
requests_per_user = 2
max_tokens = 256
[[groups]]
name = "slow"
users = 2
requests_per_user = 1
max_tokens = 64  # ~20 KB read at 2.5 KB/s: ~8 s limited by a 4 KiB window
network_profile = "3g"
rcvbuf_bytes = 4096
read = { kind = "paced", bytes_per_read = 256, interval_s = 0.1 }
"""


@needs_net_admin
def test_shaped_run_on_the_sim_target(tmp_path: Path):
    """Both groups run behind their own links; the 3G link is measured; the server's kernel
    saw the slow readers limited by their receive window for seconds, the fast ones not."""
    from harness.lifecycle import run_scenario
    from harness.scenario import parse_scenario

    before = host_snapshot()
    scenario = parse_scenario(SHAPED_SIM, path=tmp_path / "shaped-sim.toml")
    result = run_scenario(scenario, out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    info = json.loads((result.run_dir / "run.json").read_text())
    net = info["network"]
    assert net["errors"] == []
    assert net["server_sysctls"] == {"net.ipv4.tcp_wmem": "4096 16384 65536"}
    assert net["shaping"]["slow"]["backend"] in ("netem", "fallback")
    assert net["shaping"]["slow"]["reason"]
    assert "fast" not in net["shaping"]
    measured = net["measured"]["slow"]
    assert measured["requested"]["rtt_ms"] == 300
    assert measured["measured"]["rtt_ms"] == pytest.approx(300, rel=0.15)
    assert measured["measured"]["down_kbit"] == pytest.approx(700, rel=0.2)
    requests = pd.read_parquet(result.run_dir / "requests.parquet")
    assert set(requests["outcome"]) == {"complete"}
    by_group = requests.groupby("group")
    assert set(by_group["client_addr"].unique()["fast"]) == {net["groups"]["fast"]["client_addr"]}
    assert set(by_group["client_addr"].unique()["slow"]) == {net["groups"]["slow"]["client_addr"]}
    rwnd = by_group["server_rwnd_limited_ms"]
    assert rwnd.min()["slow"] > 5000, requests[["group", "server_rwnd_limited_ms"]]
    assert rwnd.max()["fast"] < 100
    sockets = pd.read_parquet(result.run_dir / "sockets.parquet")
    for col in ("snd_wnd_bytes", "rtt_ms", "retransmits", "rwnd_limited_ms", "sndbuf_limited_ms"):
        assert col in sockets
    slow_rtt = sockets[sockets["client_addr"] == net["groups"]["slow"]["client_addr"]]["rtt_ms"]
    assert slow_rtt.median() > 250  # the server's kernel sees the 3G round trip
    summary = {g.group: g for g in result.summary.groups}
    assert summary["slow"].server_rwnd_limited_max_ms > 5000
    state = read_state(result.run_dir / "netem-state.json")
    assert state["status"] == "released"
    assert run_leftovers(net["run_id"]) == {"netns": [], "links": []}
    assert host_snapshot() == before


@needs_net_admin
def test_sigkilled_run_is_cleaned_by_the_next_run(tmp_path: Path):
    """SIGKILL the harness while the load runs behind a shaped link: its processes end with
    it, and the next run's network removes its namespaces, links and qdiscs before building
    its own, leaving nothing for `netem clean`."""
    scenario = tmp_path / "shaped-sim.toml"
    scenario.write_text(SHAPED_SIM.replace("measure_udp_packets = 200", "measure = false"))
    out = tmp_path / "out"
    harness = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        state_path = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            found = list(out.glob("*/*/netem-state.json"))
            state = read_state(found[0]) if found else None
            locusts = [
                r for r in (state or {}).get("resources", []) if "locust" in str(r.get("what"))
            ]
            if len(locusts) == 2:
                state_path = found[0]
                break
            assert harness.poll() is None, "the run ended before it could be killed"
            time.sleep(0.2)
        assert state_path is not None, "the load never started"
        time.sleep(2)  # mid-way: requests in flight
        harness.kill()
        harness.wait(timeout=10)
    finally:
        if harness.poll() is None:
            harness.kill()
    state = read_state(state_path)
    run_id = state["run_id"]
    assert state["status"] == "active"
    left = run_leftovers(run_id)
    assert left["netns"], "a SIGKILLed run should have left its namespaces"
    shaping = [r for r in state["resources"] if r["kind"] == "shaping"]
    assert any(r["shaping_kind"] == "qdisc" for r in shaping)
    pids = [r["pid"] for r in state["resources"] if r["kind"] == "process"]
    pids += [int(r["name"].split()[0]) for r in shaping if r["shaping_kind"] == "process"]
    # Its reaper ended every process it started (delay lines, emulator, Locust) within 5 s;
    # the namespaces stay for netem clean.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert pids and not [p for p in pids if _alive(p)], state["resources"]

    following = RunNetwork(load_scenario(scenario))
    (tmp_path / "next").mkdir()
    try:
        following.setup(tmp_path / "next")
        assert run_leftovers(run_id) == {"netns": [], "links": []}
    finally:
        following.teardown(tmp_path / "next")
    removed = following.describe()["removed_at_start"]
    assert any(f"zw-{run_id}-" in r for r in removed), removed
    done = subprocess.run(
        [sys.executable, "-m", "harness", "netem", "clean", "--results", str(out),
         "--run-id", run_id],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert run_leftovers(run_id) == {"netns": [], "links": []}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], done.stdout
    assert read_state(state_path)["status"] == "cleaned"
    # nftables tables and qdiscs lived in the run's namespaces, gone with them; none in the host.
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True)
    assert f"zw-{run_id}" not in nft.stdout
    with IPRoute() as ipr:
        assert not [x for x in ipr.get_links() if x.get("ifname", "").startswith(f"zw-{run_id}")]
    # The killed run's folder is still a run folder: analyze ends it, "killed", on its records.
    run_dir = state_path.parent
    done = run_cli("analyze", str(run_dir))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "killed" and "killed" in info["failure"], info.get("failure")
    assert 0 < info["duration_s"] < 120
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "killed"
    assert len(pd.read_parquet(run_dir / "requests.parquet")) >= 1


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_state_file_records_before_creating(tmp_path: Path):
    state = NetemState(tmp_path, "abcdef", runtime_dir=Path(tempfile.mkdtemp()))
    state.record("netns", name="zw-abcdef-srv")
    on_disk = json.loads(state.path.read_text())
    assert on_disk["resources"] == [{"kind": "netns", "name": "zw-abcdef-srv"}]
    assert on_disk["owner"]["pid"] == os.getpid()
    assert json.loads(state.runtime_path.read_text()) == on_disk
    state.finish()
    assert not state.runtime_path.exists()
    assert read_state(state.path)["status"] == "released"


WIRE_SIM = """
name = "wire"
max_duration_s = 60
cooldown_s = 1
[target]
kind = "sim"
[target.engine]
num_blocks = 256
block_size = 32
[netem]
isolate = true
capture = true
[[groups]]
name = "fast"
users = 1
requests_per_user = 2
max_tokens = 64
[[groups]]
name = "stalled"
users = 2
requests_per_user = 1
max_tokens = 512
rcvbuf_bytes = 4096
action = { kind = "stop_reading", after_tokens = 8, hold_s = 3, close = "rst" }
"""


@needs_net_admin
@pytest.mark.skipif(not shutil.which("tcpdump"), reason="tcpdump is not installed")
def test_capture_on_each_groups_link_finds_zero_windows_and_who_reset(tmp_path: Path):
    from harness.lifecycle import run_scenario
    from harness.scenario import parse_scenario

    scenario = parse_scenario(WIRE_SIM, path=tmp_path / "wire.toml")
    result = run_scenario(scenario, out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    wire = pd.read_parquet(result.run_dir / "wire.parquet")
    assert set(wire["group"]) == {"fast", "stalled"}
    fast = wire[wire["group"] == "fast"]
    assert not (fast["event"] == "zero_window").any()
    stalled = result.summary.stalled_flows
    assert stalled is not None and len(stalled) == 2
    for flow in stalled:
        assert flow["group"] == "stalled"
        assert flow["zero_window_by"] == "client" and flow["rst_by"] == "client"
        # The client stopped reading after 8 tokens and reset 3 s later.
        assert 1.5 < flow["zero_window_to_rst_s"] < 4.5


@needs_net_admin
def test_sigterm_mid_run_releases_everything(tmp_path: Path):
    scenario = tmp_path / "shaped-sim.toml"
    scenario.write_text(SHAPED_SIM.replace("measure_udp_packets = 200", "measure = false"))
    out = tmp_path / "out"
    harness = subprocess.Popen(
        [sys.executable, "-m", "harness", "run", str(scenario), "--out", str(out),
         "--no-progress"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        state_path = None
        while time.monotonic() < deadline and state_path is None:
            found = list(out.glob("*/*/netem-state.json"))
            state = read_state(found[0]) if found else None
            if state and sum("locust" in str(r.get("what")) for r in state["resources"]) == 2:
                state_path = found[0]
            time.sleep(0.2)
        assert state_path is not None, "the load never started"
        time.sleep(2)
        harness.send_signal(signal.SIGTERM)
        assert harness.wait(timeout=120) == 130
    finally:
        if harness.poll() is None:
            harness.kill()
    state = read_state(state_path)
    assert state["status"] == "released"
    assert run_leftovers(state["run_id"]) == {"netns": [], "links": []}
    pids = [r["pid"] for r in state["resources"] if r["kind"] == "process"]
    assert not [p for p in pids if _alive(p)]
    info = json.loads((state_path.parent / "run.json").read_text())
    assert info["status"] == "interrupted" and info["network"]["errors"] == []
