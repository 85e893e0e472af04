"""Link shaping on real namespaces: requested vs measured delay, rate and loss; clean release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from netem import (
    PRESETS,
    DelayLine,
    DirectionProfile,
    LinkProfile,
    ShapingError,
    ShapingUnsupported,
    UnknownPreset,
    apply_profile,
    clean_all,
    delay_line_processes,
    leftovers,
    measure_link,
    preset,
    probe_kernel,
    resolve_profile,
    show,
)
from tests.netem_fixtures import NsPair, ns_pair

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def link() -> Iterator[NsPair]:
    with ns_pair() as pair:
        yield pair
        clean_all(namespaces=[pair.client_ns, pair.server_ns])


def _measure(pair: NsPair, profile: LinkProfile, **kw: object) -> object:
    return measure_link(client_netns=pair.client_ns, server_netns=pair.server_ns,
                        server_addr=pair.server_addr, client_addr=pair.client_addr,
                        profile=profile, **kw)  # type: ignore[arg-type]


def _nothing_left(pair: NsPair) -> None:
    state = show(pair.client_ns, pair.client_if)
    assert not state.shaped, state
    assert leftovers(namespaces=[pair.client_ns, pair.server_ns]) == []
    assert [q.kind for q in state.qdiscs] == ["noqueue"]
    assert [q.kind for q in show(pair.server_ns, pair.server_if).qdiscs] == ["noqueue"]


# --- profiles (no privileges needed) ---------------------------------------------------------


def test_presets_name_their_source_and_validate():
    assert {"lte", "3g", "edge", "congested-wifi", "geo-satellite"} <= set(PRESETS)
    for name, p in PRESETS.items():
        assert p.name == name and p.source, name
        assert p.down.rate_kbit and p.up.rate_kbit and p.rtt_ms > 0
    assert preset("GEO_satellite").rtt_ms == 540
    with pytest.raises(UnknownPreset, match="presets: .*3g"):
        preset("5g-mmwave")


def test_profile_validation_names_the_field():
    with pytest.raises(ValidationError, match="jitter_ms"):
        DirectionProfile(delay_ms=10, jitter_ms=20)
    with pytest.raises(ValidationError, match="loss_pct"):
        DirectionProfile(loss_pct=120)
    with pytest.raises(ValidationError, match="reorder_pct needs delay_ms"):
        DirectionProfile(reorder_pct=5)
    p = resolve_profile({"preset": "3g", "down": {"loss_pct": 2}})
    assert p.down.loss_pct == 2 and p.down.rate_kbit == 700 and p.up == preset("3g").up
    sym = LinkProfile.symmetric(delay_ms=100, loss_pct=1)
    assert sym.up.delay_ms == sym.down.delay_ms == 50 and sym.rtt_ms == 100


def test_delay_line_keeps_order_and_reorders_the_requested_share():
    line = DelayLine(delay_ms=100, jitter_ms=50, reorder_pct=0, seed=1)
    dues = [line.due(i * 0.001) for i in range(2000)]
    assert dues == sorted(dues)
    assert all(0.05 <= d - i * 0.001 for i, d in enumerate(dues))
    line = DelayLine(delay_ms=100, jitter_ms=0, reorder_pct=25, seed=1)
    undelayed = sum(line.due(i * 0.01) == i * 0.01 for i in range(4000))
    assert 800 < undelayed < 1200


# --- the kernel ---------------------------------------------------------------------------------


def test_probe_agrees_with_tc(link: NsPair):
    f = probe_kernel()
    res = subprocess.run(["ip", "netns", "exec", link.server_ns, "tc", "qdisc", "add", "dev",
                          "lo", "root", "netem", "delay", "1ms"], capture_output=True, text=True)
    assert f.netem == (res.returncode == 0), res.stderr
    if res.returncode == 0:
        subprocess.run(["ip", "netns", "exec", link.server_ns, "tc", "qdisc", "del", "dev", "lo",
                        "root"], check=True)
    else:
        assert "Specified qdisc kind is unknown" in res.stderr
    assert f.tbf and f.ifb and f.u32_mirred, f.errors


# --- requested vs measured ------------------------------------------------------------------


def test_100ms_delay_gives_100ms_tcp_rtt(link: NsPair):
    # netem's semantics: delay on one interface's egress, so RTT = the delay
    shaping = apply_profile(LinkProfile(up=DirectionProfile(delay_ms=100)),
                            netns=link.client_ns, ifname=link.client_if)
    try:
        m = _measure(link, shaping.profile, throughput=False, loss=False, rtt_samples=30)
    finally:
        assert shaping.release() == []
    # rtt_ms is the kernel's own RTT of the probe connection (tcpi_rtt); the probe's own round
    # trips include its scheduling delays on a loaded machine, so only their minimum is held to
    # the same bound.
    assert 85 <= m.rtt_ms <= 115, m  # type: ignore[attr-defined]
    assert 85 <= m.app_rtt_min_ms <= 115, m  # type: ignore[attr-defined]
    # and the unshaped link is back to sub-millisecond
    m0 = _measure(link, LinkProfile(), throughput=False, loss=False)
    assert m0.rtt_ms < 10, m0  # type: ignore[attr-defined]
    _nothing_left(link)


def test_jitter_spreads_the_rtt_around_the_delay(link: NsPair):
    p = LinkProfile(down=DirectionProfile(delay_ms=50, jitter_ms=20))  # 30-70 ms, uniform
    with apply_profile(p, netns=link.client_ns, ifname=link.client_if) as shaping:
        m = _measure(link, shaping.profile, throughput=False, loss=False, rtt_samples=40)
    assert 28 <= m.app_rtt_min_ms <= 40, m  # type: ignore[attr-defined]
    assert 42 <= m.app_rtt_p50_ms <= 62, m  # type: ignore[attr-defined]
    _nothing_left(link)


def test_1mbit_rate_gives_1mbit_throughput(link: NsPair):
    p = LinkProfile(down=DirectionProfile(rate_kbit=1000), up=DirectionProfile(rate_kbit=1000))
    with apply_profile(p, netns=link.client_ns, ifname=link.client_if,
                       peer=(link.server_ns, link.server_if)) as shaping:
        assert ("link", f"zw-ifbu-{shaping.tag[3:]}", link.server_ns) in shaping.resources
        state = show(link.client_ns, link.client_if, peer=(link.server_ns, link.server_if))
        assert {(q.ifname, q.kind) for q in state.peer_qdiscs} >= {
            (link.server_if, "ingress"), (f"zw-ifbu-{shaping.tag[3:]}", "tbf")}
        m = _measure(link, shaping.profile, loss=False, duration_s=3.0)
    # Never above the rate; below it by up to a third on a busy 2-CPU machine (a full run of the
    # suite once measured 730 kbit/s down, 954 up). An unshaped veth gives Gbit/s, a kbit/kbyte
    # mix-up 8x: both far outside.
    for got in (m.down_kbit, m.up_kbit):  # type: ignore[attr-defined]
        assert got is not None and 650 <= got <= 1150, m
    _nothing_left(link)


def test_5pct_loss_gives_3_to_7pct(link: NsPair):
    p = LinkProfile(down=DirectionProfile(loss_pct=5), up=DirectionProfile(loss_pct=5))
    with apply_profile(p, netns=link.client_ns, ifname=link.client_if,
                       peer=(link.server_ns, link.server_if)) as shaping:
        assert {w for k, _, w in shaping.resources if k == "nft-table"} == {
            link.client_ns, link.server_ns}
        m = _measure(link, shaping.profile, throughput=False, udp_packets=4000)
    assert m.udp_packets == 4000, m  # type: ignore[attr-defined]
    for got in (m.down_loss_pct, m.up_loss_pct):  # type: ignore[attr-defined]
        assert got is not None and 3.0 <= got <= 7.0, m
    _nothing_left(link)


def test_3g_preset_measures_as_requested(link: NsPair, tmp_path: Path):
    p = preset("3g")  # RTT 300 ms, 700 kbit/s each way
    with apply_profile(p, netns=link.client_ns, ifname=link.client_if,
                       log_dir=tmp_path) as shaping:
        m = _measure(link, p, loss=False, duration_s=3.0, rtt_samples=10)
        assert shaping.alive()
    assert 255 <= m.rtt_ms <= 345, m  # type: ignore[attr-defined]
    for got in (m.down_kbit, m.up_kbit):  # type: ignore[attr-defined]
        assert got is not None and 0.85 * 700 <= got <= 1.15 * 700, m
    logs = [f.name for f in tmp_path.iterdir()]
    assert logs == [f"zw-dl-{shaping.tag[3:]}-down.log"]
    _nothing_left(link)


def test_netem_backend_options_use_tc_units():
    from netem import NetemBackend

    o = NetemBackend.options(DirectionProfile(delay_ms=150, jitter_ms=20, loss_pct=1.5,
                                              rate_kbit=700, reorder_pct=5, corrupt_pct=0.1))
    assert o["delay"] == 150_000 and o["jitter"] == 20_000  # microseconds
    assert o["loss"] == 1.5 and o["prob_reorder"] == 5 and o["prob_corrupt"] == 0.1
    assert "rate" not in o  # a tbf child carries the rate


def test_backends_are_registered_by_kind():
    from netem import BACKENDS, FallbackBackend, NetemBackend, select_backend
    from zwcore import Registry, UnknownKindError

    assert isinstance(BACKENDS, Registry)
    assert BACKENDS.kinds() == ["fallback", "netem"]
    assert BACKENDS.get("netem") is NetemBackend and BACKENDS.get("fallback") is FallbackBackend
    with pytest.raises(UnknownKindError, match="valid kinds: fallback, netem"):
        BACKENDS.get("tc")
    with pytest.raises(ShapingUnsupported, match="unknown shaping backend 'tc'; kinds: auto, "):
        select_backend(LinkProfile(), None, "tc", probe_kernel())


def test_every_netem_error_is_a_network_error():
    import netem
    from zwcore import NetworkError

    errors = {n: getattr(netem, n) for n in netem.__all__
              if isinstance(getattr(netem, n), type)
              and issubclass(getattr(netem, n), BaseException)}
    assert set(errors) >= {"NetemError", "NetemPermissionError", "NetnsError", "ProbeError",
                           "ShapingError", "ShapingUnsupported", "UnknownPreset", "CaptureError"}
    for cls in errors.values():
        assert issubclass(cls, netem.NetemError) and issubclass(cls, NetworkError), cls
    # the built-in bases callers catch them by are kept
    assert issubclass(UnknownPreset, ValueError) and issubclass(ShapingError, RuntimeError)
    assert issubclass(ShapingUnsupported, ShapingError)


def test_loss_through_iptables_statistic_when_nft_is_missing(link: NsPair):
    import dataclasses

    f = dataclasses.replace(probe_kernel(), nft_numgen=False)
    if not f.iptables_statistic:
        pytest.skip("no iptables statistic match here")
    p = LinkProfile(down=DirectionProfile(loss_pct=5), up=DirectionProfile(loss_pct=5))
    with apply_profile(p, netns=link.client_ns, ifname=link.client_if, features=f) as shaping:
        # the chains, and iptables-nft's own "ip mangle" table when it made it just now
        assert {k for k, _ in shaping.created} >= {"iptables-chain"}
        assert {n for k, n in shaping.created if k == "nft-table"} <= {"ip mangle"}
        m = _measure(link, p, throughput=False, udp_packets=4000)
    assert m.udp_packets == 4000, m  # type: ignore[attr-defined]
    for got in (m.down_loss_pct, m.up_loss_pct):  # type: ignore[attr-defined]
        assert got is not None and 3.0 <= got <= 7.0, m
    _nothing_left(link)


def test_netem_backend_requests_reach_the_kernel(link: NsPair):
    """Where netem exists, the netem backend applies every field; here (no netem) its netlink
    requests still encode and reach the kernel, which refuses the qdisc kind (ENOENT), and what
    was made before that (IFB, ingress redirect) is released."""
    import errno

    from pyroute2.netlink.exceptions import NetlinkError

    from netem import BACKENDS, AppliedShaping, shaping_tag
    from netem._shaping import _Applier

    full = DirectionProfile(delay_ms=20, jitter_ms=5, loss_pct=1, rate_kbit=1000, reorder_pct=5,
                            duplicate_pct=1, corrupt_pct=0.1)
    f = probe_kernel()
    for p in (LinkProfile(up=full), LinkProfile(down=full)):
        if f.netem:
            with apply_profile(p, netns=link.client_ns, ifname=link.client_if, backend="netem"):
                assert "netem" in {q.kind for q in show(link.client_ns, link.client_if).qdiscs}
        else:
            s = AppliedShaping(backend="netem", reason="test", profile=p, netns=link.client_ns,
                               ifname=link.client_if,
                               tag=shaping_tag(link.client_ns, link.client_if))
            with pytest.raises(NetlinkError) as e:
                BACKENDS.get("netem")().apply(p, _Applier(s, None, f))
            assert e.value.code == errno.ENOENT
            assert s.release() == []
        _nothing_left(link)


# --- failure before applying, release, clean ---------------------------------------------------


def test_unsupported_profile_fails_before_anything_is_applied(link: NsPair):
    if probe_kernel().netem:
        pytest.skip("this kernel has netem: every profile is supported")
    created: list[tuple[str, str, str | None]] = []
    p = LinkProfile(down=DirectionProfile(rate_kbit=500, delay_ms=50, duplicate_pct=1))
    netem_missing = r"CONFIG_NET_SCH_NETEM"
    with pytest.raises(ShapingUnsupported, match=r"down\.duplicate_pct needs .*" + netem_missing):
        apply_profile(p, netns=link.client_ns, ifname=link.client_if,
                      on_create=lambda *r: created.append(r))
    with pytest.raises(ShapingUnsupported, match=r"backend 'netem' \(forced\).*" + netem_missing):
        apply_profile(LinkProfile(up=DirectionProfile(delay_ms=5)), netns=link.client_ns,
                      ifname=link.client_if, backend="netem")
    with pytest.raises(ShapingUnsupported, match="need a network namespace the run created"):
        apply_profile(LinkProfile(up=DirectionProfile(delay_ms=5)), netns=None,
                      ifname="zw-not-there")
    with pytest.raises(ShapingError, match="refusing to shape interface 'lo'"):
        apply_profile(LinkProfile(up=DirectionProfile(rate_kbit=5)), netns=None, ifname="lo")
    assert created == []
    _nothing_left(link)


def test_release_removes_every_qdisc_table_chain_and_process(link: NsPair):
    p = LinkProfile(down=DirectionProfile(delay_ms=20, jitter_ms=5, loss_pct=1, rate_kbit=2000),
                    up=DirectionProfile(delay_ms=20, loss_pct=1, rate_kbit=1000))
    recorded: list[tuple[str, str, str | None]] = []
    shaping = apply_profile(p, netns=link.client_ns, ifname=link.client_if,
                            on_create=lambda *r: recorded.append(r))
    try:
        assert [(k, n) for k, n, _ in recorded] == shaping.created
        assert {k for k, _ in shaping.created} >= {"qdisc", "link", "nft-table", "process",
                                                  "iptables-chain"}
        state = show(link.client_ns, link.client_if)
        assert state.shaped and len(state.delay_lines) == 1 and shaping.alive()
        assert {q.kind for q in state.qdiscs} >= {"tbf", "ingress"}
        assert any("numgen random" in t for t in state.nft_tables.values())
        assert shaping.record()["backend"] == shaping.backend
        m = _measure(link, p, throughput=False, loss=False)
        # 20 + 20 ms, jitter +/- (5 + 0) ms; the 1 % loss can stretch the kernel's smoothed RTT
        assert 30 <= m.app_rtt_min_ms <= 50, m  # type: ignore[attr-defined]
    finally:
        assert shaping.release() == []
    assert shaping.release() == []  # idempotent
    pid = int(next(n for k, n in shaping.created if k == "process").split()[0])
    assert not Path(f"/proc/{pid}").exists() or b"_delayline" not in Path(
        f"/proc/{pid}/cmdline").read_bytes()
    _nothing_left(link)


def test_killed_harness_leaves_nothing_that_clean_all_misses(link: NsPair):
    """SIGKILL the process that applied a profile: its delay line exits by itself, and
    clean_all removes the qdiscs, tables and chains left in the namespace."""
    code = (
        "import sys, time\n"
        "from netem import apply_profile, LinkProfile, DirectionProfile\n"
        "p = LinkProfile(down=DirectionProfile(delay_ms=30, rate_kbit=1000, loss_pct=1))\n"
        f"apply_profile(p, netns={link.client_ns!r}, ifname={link.client_if!r})\n"
        "print('applied', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "applied"
        assert show(link.client_ns, link.client_if).delay_lines
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 5
    tag_prefix = "zw-dl-"
    while time.monotonic() < deadline and any(
        t for _, t in delay_line_processes(tag_prefix)
        if t in {x for _, x in show(link.client_ns, link.client_if).delay_lines}
    ):
        time.sleep(0.1)
    assert show(link.client_ns, link.client_if).delay_lines == []
    left = leftovers(namespaces=[link.client_ns])
    assert {k for k, _, _ in left} >= {"qdisc", "link", "nft-table", "iptables-chain"}
    removed = clean_all(namespaces=[link.client_ns])
    assert sorted(removed) == sorted(left)
    _nothing_left(link)
