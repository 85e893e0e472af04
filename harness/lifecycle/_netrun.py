"""The run's network: topology, shaped links and their measurement, for one scenario.

:func:`plan_network` decides, before anything starts, whether the scenario needs its own
namespaces (a group names a network profile, ``[server_net]`` is set, or ``[netem] isolate``)
and moves the target's and proxy's listening address to the server namespace's address.
:class:`RunNetwork` then builds it (:meth:`RunNetwork.setup`), tells the run where each
process runs, and releases everything (:meth:`RunNetwork.teardown`); every resource is written
to the run folder's ``netem-state.json`` before it is created, so ``zerowindow netem clean``
can remove what a killed run left. A proxy comparison builds one network for all its
configurations (identical links and shaping for each) and captures the wire per configuration
(:meth:`RunNetwork.start_captures`, :meth:`RunNetwork.finish_captures`).
"""

from __future__ import annotations

import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from harness.scenario import Scenario, ScenarioError
from harness.servers import Target, free_port
from netem import (
    CaptureError,
    LinkProfile,
    NetemError,
    NetemState,
    ShapingError,
    Topology,
    WireCapture,
    apply_profile,
    clean,
    measure_link,
    process_start_ticks,
    resolve_group_profile,
    select_backend,
    stalled_flows,
    wire_events,
)


def _listen_fields(config: Any) -> tuple[str, str] | None:
    """The (host, port) field names of a target or proxy config that listens, else None."""
    fields = type(config).model_fields
    if "host" in fields and "port" in fields:
        return "host", "port"
    if "listen_host" in fields and "listen_port" in fields:
        return "listen_host", "listen_port"
    return None


class RunNetwork:
    """Namespaces, links and shaping of one run (see the module docstring).

    ``topology`` names and addresses; ``shaping`` the applied shapings and ``shaping_info``
    their records per group (backend, reason, profile, resources); ``measured`` the requested
    and measured figures per shaped group; ``stalled`` the stalled flows of the captures.
    """

    def __init__(self, scenario: Scenario, *, run_id: str | None = None) -> None:
        self.scenario = scenario
        self.run_id = run_id or secrets.token_hex(3)
        self.state: NetemState | None = None
        self.topology = Topology(
            self.run_id,
            [g.name for g in scenario.groups],
            state=None,  # set in setup, before anything is created
            server_sysctls=scenario.server_net.sysctls() if scenario.server_net else {},
        )
        self.shaping: list[Any] = []
        self.shaping_info: dict[str, Any] = {}
        self.measured: dict[str, Any] = {}
        self.errors: list[str] = []
        self.removed_at_start: list[str] = []
        self.captures: dict[str, WireCapture] = {}
        self.stalled: list[dict[str, Any]] = []

    @property
    def server_netns(self) -> str:
        return self.topology.server_ns

    def group_netns(self, group: str) -> str:
        return self.topology.links[group].netns

    def rewrite(self, scenario: Scenario) -> Scenario:
        """``scenario`` with the target and every proxy (``proxy`` and each of ``proxies``)
        listening on the server address (ports chosen now when 0; the server namespace is
        new, so any port is free there)."""
        update: dict[str, Any] = {
            "target": self._listen_on_server(scenario.target),
            "proxy": self._listen_on_server(scenario.proxy),
        }
        if scenario.proxies:
            update["proxies"] = [
                p.model_copy(update={"proxy": self._listen_on_server(p.proxy)})
                for p in scenario.proxies
            ]
        return scenario.model_copy(update=update)

    def _listen_on_server(self, config: Any) -> Any:
        fields = _listen_fields(config)
        if fields is None:
            return config
        host, port = fields
        return config.model_copy(
            update={
                host: self.topology.server_addr,
                port: getattr(config, port) or free_port("127.0.0.1"),
            }
        )

    # -- life cycle ---------------------------------------------------------------------

    def setup(self, run_dir: Path) -> None:
        """Remove what dead runs left (their state files' copies in ``/run/zerowindow``: the
        processes, namespaces, links and qdiscs of runs whose harness is gone, as ``zerowindow
        netem clean`` does; a live run's are left alone), then create the topology (state file
        in ``run_dir``), set the server's sysctls, shape and measure the links. Raises
        :class:`NetemError` (``NetemPermissionError`` without CAP_NET_ADMIN)."""
        self.removed_at_start = clean(results=None).removed
        if self.removed_at_start:
            print(
                "removed what runs killed earlier left: " + ", ".join(self.removed_at_start),
                file=sys.stderr,
                flush=True,
            )
        self.state = NetemState(run_dir, self.run_id)
        self.topology.state = self.state
        self.check_shaping()
        self.topology.create()
        self._shape()

    def start_captures(self, run_dir: Path) -> None:
        """With ``[netem] capture``: tcpdump on each group's client-side veth end, into
        ``run_dir/wire-<group>.pcap``; else nothing. Raises :class:`NetemError`."""
        if not self.scenario.netem.capture:
            return
        self.stalled = []
        for group, link in self.topology.links.items():
            capture = WireCapture(link.netns, link.client_ifname, run_dir / f"wire-{group}.pcap")
            try:
                capture.start()
            except CaptureError as exc:
                raise NetemError(f"group {group}: {exc}") from None
            self.captures[group] = capture
            self.record_pid(capture.pid, f"tcpdump {group}")

    def finish_captures(self, run_dir: Path) -> None:
        """Stop the captures started by :meth:`start_captures`, write
        ``run_dir/wire.parquet`` (one row per event, with ``group``) and keep the stalled flows
        (see :func:`netem._wire.stalled_flows`). Never raises: problems go to ``errors``."""
        try:
            self._finish_captures(run_dir)
        except Exception as exc:
            self.errors.append(f"wire capture: {type(exc).__name__}: {exc}")

    def _finish_captures(self, run_dir: Path) -> None:
        frames = []
        captures, self.captures = self.captures, {}
        for group, capture in captures.items():
            pcap = capture.stop()
            try:
                events = wire_events(pcap)
            except Exception as exc:  # an unreadable capture is a gap, not a failed run
                self.errors.append(f"analysing {pcap.name}: {type(exc).__name__}: {exc}")
                continue
            events.insert(0, "group", group)
            frames.append(events)
        if not frames:
            return
        events = pd.concat(frames, ignore_index=True)
        events.to_parquet(run_dir / "wire.parquet", index=False)
        for group in captures:
            flows = stalled_flows(events[events["group"] == group].drop(columns="group"))
            flows.insert(0, "group", group)
            self.stalled += [
                {str(k): v for k, v in row.items()} for row in flows.to_dict("records")
            ]

    def _profiles(self) -> dict[str, LinkProfile]:
        """The link profile of each shaped group."""
        custom = self.scenario.netem.profiles
        out = {}
        for group in self.scenario.groups:
            profile = resolve_group_profile(group.network_profile, custom)
            if profile is not None:
                out[group.name] = profile
        return out

    def check_shaping(self) -> None:
        """Select a backend for every shaped group before anything is created. Raises
        :class:`NetemError` naming the group and the missing kernel feature."""
        for group, profile in self._profiles().items():
            try:
                select_backend(
                    profile, self.topology.links[group].netns, self.scenario.netem.backend
                )
            except ShapingError as exc:
                raise NetemError(f"group {group}: {exc}") from None

    def _shape(self) -> None:
        """Shape each group's link on its client-side veth end (``up`` on egress, ``down`` on
        ingress; see :func:`netem.apply_profile`), then measure it through the path."""
        c = self.scenario.netem
        for group, profile in self._profiles().items():
            link = self.topology.links[group]
            try:
                applied = apply_profile(
                    profile,
                    netns=link.netns,
                    ifname=link.client_ifname,
                    backend=c.backend,
                    on_create=self._on_create,
                    # Up-direction rate and loss on the server end's ingress, like a real link
                    # (no local drops that TCP would see as failed sends).
                    peer=(self.topology.server_ns, link.server_ifname),
                )
            except ShapingError as exc:
                raise NetemError(f"group {group}: {exc}") from None
            self.shaping.append(applied)
            self.shaping_info[group] = applied.record()
            if c.measure:
                self.measured[group] = self._measure(group, profile)

    def _measure(self, group: str, profile: LinkProfile) -> dict[str, Any]:
        """Requested and measured figures of ``group``'s link (RTT, rate and loss each way)."""
        link = self.topology.links[group]
        c = self.scenario.netem
        try:
            measured = measure_link(
                client_netns=link.netns,
                server_netns=self.topology.server_ns,
                server_addr=self.topology.server_addr,
                client_addr=link.client_addr,
                profile=profile,
                duration_s=c.measure_duration_s,
                udp_packets=c.measure_udp_packets,
                loss=c.measure_udp_packets > 0,
            ).as_dict()
        except OSError as exc:
            raise NetemError(f"group {group}: the shaped link carries no traffic ({exc})") from None
        return {
            "requested": {
                "rtt_ms": profile.rtt_ms,
                "down_kbit": profile.down.rate_kbit,
                "up_kbit": profile.up.rate_kbit,
                "down_loss_pct": profile.down.loss_pct,
                "up_loss_pct": profile.up.loss_pct,
            },
            "measured": measured,
        }

    def _on_create(self, kind: str, name: str, netns: str | None) -> None:
        """Callback of the shaping backends: record each resource as it is created."""
        assert self.state is not None
        self.state.record("shaping", shaping_kind=kind, name=name, netns=netns)

    def record_process(self, proc: subprocess.Popen[bytes] | None, what: str) -> None:
        """Record a process group the run started (so ``netem clean`` can kill it)."""
        if proc is not None:
            self.record_pid(proc.pid, what, group=True)

    def record_pid(self, pid: int | None, what: str, *, group: bool = False) -> None:
        """Record process ``pid`` (the leader of a process group if ``group``)."""
        if self.state is not None and pid is not None:
            self.state.record(
                "process", pid=pid, start_ticks=process_start_ticks(pid), group=group, what=what
            )

    def teardown(self, run_dir: Path) -> None:
        """Stop and analyse the captures still running (into ``run_dir``), release the
        shaping, then the namespaces and links; mark the state file released. Never raises:
        problems are kept in ``errors`` (and in ``run.json``)."""
        if self.captures:
            self.finish_captures(run_dir)
        for applied in reversed(self.shaping):
            try:
                self.errors += [f"releasing shaping: {e}" for e in applied.release()]
            except Exception as exc:
                self.errors.append(f"releasing shaping: {type(exc).__name__}: {exc}")
        if self.state is None:
            return
        try:
            self.topology.destroy()
        except Exception as exc:
            self.errors.append(f"removing the topology: {type(exc).__name__}: {exc}")
        self.state.finish("released" if not self.errors else "active")

    @property
    def stalled_flows(self) -> list[dict[str, Any]] | None:
        """The stalled flows of the last captures (``None`` without ``[netem] capture``)."""
        return self.stalled if self.scenario.netem.capture else None

    def describe(self) -> dict[str, Any]:
        """Facts for ``run.json``: topology, server sysctls, shaping backend per group and
        direction (and why), requested and measured link figures."""
        return {
            **self.topology.describe(),
            "state_file": str(self.state.path) if self.state else None,
            "shaping": self.shaping_info,
            "measured": self.measured,
            "stalled_flows": self.stalled_flows,
            "errors": self.errors,
            "removed_at_start": self.removed_at_start,
        }


def start_target(target: Target, network: RunNetwork | None, run_dir: Path) -> None:
    """Start ``target``; with a ``network``, build it first and start the target inside its
    server namespace, its processes recorded in the state file (also when the start
    fails). Raises what :meth:`RunNetwork.setup` and the target's ``start`` raise."""
    if network is None:
        target.start(run_dir)
        return
    network.setup(run_dir)
    for process in target.processes():
        process.netns = network.server_netns
    try:
        target.start(run_dir)
    finally:
        for process in target.processes():
            network.record_process(process.proc, process.label)


def plan_network(scenario: Scenario) -> tuple[Scenario, RunNetwork | None]:
    """The scenario as the run will start it, and its network (``None`` when it needs
    none). Raises :class:`ScenarioError` for a target the run cannot move into the server
    namespace (``kind = "url"``, or ``--target-url``)."""
    if not scenario.needs_topology():
        return scenario, None
    if scenario.target.kind == "url":
        raise ScenarioError(
            "network profiles and [server_net] need a target the run starts (vllm or sim) "
            "inside the server's namespace; an already running server (--target-url, "
            'kind = "url") cannot be moved there'
        )
    network = RunNetwork(scenario)
    return network.rewrite(scenario), network
