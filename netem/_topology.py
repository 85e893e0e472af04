"""A run's network topology: a server namespace, one namespace per user group, veth links.

Layout for run id ``a1b2c3`` (names carry the ``zw-`` prefix and the run id; interface names
stay within the kernel's 15 characters, ``IFNAMSIZ`` - 1 in include/uapi/linux/if.h)::

    root namespace                 zw-a1b2c3-srv                       zw-a1b2c3-g<i>
    zw-a1b2c3-h 198.19.x.2/30 ==== zw-a1b2c3-hs 198.19.x.1/30  (the server address)
                                   zw-a1b2c3-s<i> 198.18.a.b+1/30 ==== zw-a1b2c3-c<i> .b+2/30
                                                                       default via .b+1

The target and proxy listen on the server address inside ``zw-<id>-srv``, so the sysctls
set there (``net.ipv4.tcp_wmem``...) are theirs alone. Each group's load process runs in its
own namespace and reaches the server over its own veth pair, whose two ends are where its
link is shaped. The root namespace reaches the server over the host link (for health checks
and the metrics scraper); nothing is routed between namespaces, and no host interface,
route or qdisc is touched: the host side gets one new interface and the connected route of
its /30, both gone when the interface is deleted.

Addresses come from 198.18.0.0/15, reserved for benchmarking (RFC 2544, RFC 6890): group links
from 198.18.0.0/16 (private to each run's namespaces), host links from 198.19.0.0/16, a /30
chosen from the run id that no root-namespace address overlaps.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, field
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netem._netns import (
    NETNS_DIR,
    PREFIX,
    NetemError,
    create_netns,
    kill_netns_processes,
    remove_netns,
    require_net_admin,
    set_sysctls,
)
from netem._state import NetemState

HOST_NET = ipaddress.ip_network("198.19.0.0/16")
GROUP_NET = ipaddress.ip_network("198.18.0.0/16")
MAX_GROUPS = 64 * 256


@dataclass(frozen=True)
class GroupLink:
    """The link of one user group. ``netns``: where its load process runs; ``client_ifname``
    (in ``netns``) and ``server_ifname`` (in the server namespace) are the veth ends, the
    places where upload and download are shaped; ``client_addr`` is the address the server
    sees its connections come from."""

    group: str
    netns: str
    client_ifname: str
    server_ifname: str
    client_addr: str
    server_side_addr: str


@dataclass
class Topology:
    """The namespaces and links of run ``run_id`` for ``groups`` (group names, in order).

    :meth:`create` builds everything, recording each resource in ``state`` first;
    :meth:`destroy` removes it (safe after a partial :meth:`create`, and twice).
    ``server_sysctls`` (``{"net.ipv4.tcp_wmem": "4096 16384 65536"}``) are set in the server
    namespace; ``applied_sysctls`` holds what the kernel read back.
    """

    run_id: str
    groups: list[str]
    state: NetemState | None
    server_sysctls: dict[str, str] = field(default_factory=dict)
    applied_sysctls: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.groups) > MAX_GROUPS:
            raise NetemError(f"at most {MAX_GROUPS} groups can have their own link")
        rid = self.run_id
        self.server_ns = f"{PREFIX}{rid}-srv"
        self.host_ifname = f"{PREFIX}{rid}-h"
        self.host_peer_ifname = f"{PREFIX}{rid}-hs"
        for name in (self.host_ifname, self.host_peer_ifname):
            if len(name) > 15:
                raise NetemError(f"interface name {name} is longer than 15 characters")
        self.links: dict[str, GroupLink] = {}
        for i, group in enumerate(self.groups):
            base = GROUP_NET.network_address + 4 * i
            self.links[group] = GroupLink(
                group=group,
                netns=f"{PREFIX}{rid}-g{i}",
                client_ifname=f"{PREFIX}{rid}-c{i}",
                server_ifname=f"{PREFIX}{rid}-s{i}",
                client_addr=str(base + 2),
                server_side_addr=str(base + 1),
            )
        self.server_addr, self.host_addr = self._pick_host_subnet()

    # -- creation -----------------------------------------------------------------------

    def create(self) -> None:
        """Create namespaces, links, addresses and routes. Raises
        :class:`~netem._netns.NetemPermissionError` without CAP_NET_ADMIN and
        :class:`NetemError` when the kernel refuses a step (the message names it)."""
        require_net_admin("creating the run's network namespaces")
        if self.state is None:
            raise NetemError("the topology needs a state file before it creates anything")
        self._netns(self.server_ns)
        self._host_veth()
        for link in self.links.values():
            self._netns(link.netns)
            self._veth_between_namespaces(link)
        if self.server_sysctls:
            self.applied_sysctls = set_sysctls(self.server_ns, self.server_sysctls)

    def _record(self, kind: str, **fields: Any) -> None:
        assert self.state is not None
        self.state.record(kind, **fields)

    def _pick_host_subnet(self) -> tuple[str, str]:
        """(server address, host address) of a /30 in :data:`HOST_NET` that overlaps no
        address of the root namespace, starting from one chosen by the run id."""
        with IPRoute() as ipr:
            used = [
                ipaddress.ip_interface(f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}").network
                for a in ipr.get_addr(family=2)
            ]
        subnets = HOST_NET.num_addresses // 4
        start = int(self.run_id, 36) % subnets if self.run_id.isalnum() else 0
        for k in range(subnets):
            first = HOST_NET.network_address + 4 * ((start + k) % subnets)
            net = ipaddress.ip_network(f"{first}/30")
            if not any(net.overlaps(u) for u in used):
                return str(net[1]), str(net[2])
        raise NetemError(f"no free /30 left in {HOST_NET} for the host link")

    def _netns(self, name: str) -> None:
        self._record("netns", name=name)
        create_netns(name)
        with IPRoute(netns=name) as ns:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")

    def _host_veth(self) -> None:
        """The veth pair between the root namespace and the server namespace. (pyroute2
        sockets are opened one at a time: two open in one thread share an event loop that
        the first one closed stalls the other.)"""
        name, peer = self.host_ifname, self.host_peer_ifname
        self._record("link", name=name, netns=None, peer=peer)
        try:
            with IPRoute() as ipr:
                ipr.link("add", ifname=name, kind="veth", peer={"ifname": peer})
                _move(ipr, peer, self.server_ns)
                _configure(ipr, name, self.host_addr)
            with IPRoute(netns=self.server_ns) as ns:
                _configure(ns, peer, self.server_addr)
        except NetlinkError as exc:
            raise NetemError(f"cannot create veth {name}/{peer}: {exc}") from exc

    def _veth_between_namespaces(self, link: GroupLink) -> None:
        """The group's veth pair: made in the root namespace (recorded there, so a crash
        before the move leaves something ``clean`` finds), then each end moved into its
        namespace and configured there."""
        self._record(
            "link",
            name=link.server_ifname,
            netns=None,
            peer=link.client_ifname,
            moved_to=[self.server_ns, link.netns],
        )
        try:
            with IPRoute() as ipr:
                ipr.link(
                    "add", ifname=link.server_ifname, kind="veth",
                    peer={"ifname": link.client_ifname},
                )  # fmt: skip
                _move(ipr, link.client_ifname, link.netns)
                _move(ipr, link.server_ifname, self.server_ns)
            with IPRoute(netns=self.server_ns) as srv:
                _configure(srv, link.server_ifname, link.server_side_addr)
            with IPRoute(netns=link.netns) as cli:
                _configure(cli, link.client_ifname, link.client_addr)
                cli.route("add", dst="0.0.0.0/0", gateway=link.server_side_addr)
        except NetlinkError as exc:
            raise NetemError(
                f"cannot create the link of group {link.group} "
                f"({link.server_ifname}/{link.client_ifname}): {exc}"
            ) from exc

    # -- teardown -----------------------------------------------------------------------

    def destroy(self) -> list[str]:
        """Kill what still runs in the run's namespaces, delete the host link and remove the
        namespaces (their interfaces and qdiscs go with them). Returns what was removed."""
        return destroy_resources(self.state.resources if self.state else [])

    def describe(self) -> dict[str, Any]:
        """Facts for ``run.json``."""
        return {
            "run_id": self.run_id,
            "server_netns": self.server_ns,
            "server_addr": self.server_addr,
            "host_link": {"ifname": self.host_ifname, "addr": self.host_addr},
            "server_sysctls": self.applied_sysctls,
            "groups": {
                g: {
                    "netns": ln.netns,
                    "client_ifname": ln.client_ifname,
                    "server_ifname": ln.server_ifname,
                    "client_addr": ln.client_addr,
                }
                for g, ln in self.links.items()
            },
        }


def _index(ipr: IPRoute, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise NetemError(f"interface {ifname} not found")
    return int(found[0])


def _move(ipr: IPRoute, ifname: str, netns: str) -> None:
    """Move interface ``ifname`` into namespace ``netns``. The namespace file is opened here
    and held open until the kernel answered (pyroute2's own opening of a name was seen to
    move nothing now and then), and the move is checked."""
    fd = os.open(NETNS_DIR / netns, os.O_RDONLY)
    try:
        ipr.link("set", index=_index(ipr, ifname), net_ns_fd=fd)
    finally:
        os.close(fd)
    if ipr.link_lookup(ifname=ifname):
        raise NetemError(f"interface {ifname} did not move into {netns}")


def _configure(ipr: IPRoute, ifname: str, addr: str) -> None:
    index = _index(ipr, ifname)
    ipr.addr("add", index=index, address=addr, prefixlen=30)
    ipr.link("set", index=index, state="up")


def destroy_resources(resources: list[dict[str, Any]]) -> list[str]:
    """Remove recorded root-namespace links and namespaces (killing the processes inside
    first), in reverse order of creation. Missing ones are skipped. Returns descriptions of
    what was removed."""
    removed: list[str] = []
    for res in reversed(resources):
        kind = res.get("kind")
        if kind == "link" and res.get("netns") is None:
            with IPRoute() as ipr:
                found = ipr.link_lookup(ifname=res["name"])
                if found:
                    ipr.link("del", index=found[0])
                    removed.append(f"link {res['name']}")
        elif kind == "netns":
            name = res["name"]
            pids = kill_netns_processes(name)
            if pids:
                removed.append(f"processes {pids} in {name}")
            from netem._netns import list_netns

            if name in list_netns():
                remove_netns(name)
                removed.append(f"netns {name}")
    return removed
