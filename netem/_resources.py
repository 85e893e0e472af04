"""Shaping resources: create, record, remove, and find leftovers by their ``zw-`` names.

Every resource a shaping backend creates is described by ``(kind, name, netns)`` so a run's state
file can record it the moment it exists and ``zerowindow netem clean`` can remove it after a
crash. Kinds and their names:

==================  ==========================  =============================================
kind                name                        what it is
==================  ==========================  =============================================
``qdisc``           ``"<ifname> root"`` or      a root or ingress qdisc on an interface
                    ``"<ifname> ingress"``
``link``            ``"zw-ifb-xxxxxx"``         an IFB device (ingress shaping)
``nft-table``       ``"<family> <table>"``      an nftables table (``inet zw-shape-xxxxxx``;
                                                ``ip mangle`` when iptables-nft created it)
``iptables-chain``  ``"<table> <chain>"``       an iptables chain and the jumps to it
``process``         ``"<pid> <tag>"``           a delay-line process
==================  ==========================  =============================================

:func:`remove_resource` is idempotent: removing what is already gone is not an error.
"""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator

from pyroute2.netlink.exceptions import NetlinkError

from netem._nsexec import NETNS_DIR, NetnsError, ipr, run

TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
INGRESS_HANDLE = 0xFFFF0000
ROOT_HANDLE = 0x10000
DELAYLINE_MODULE = "netem._delayline"

_GONE_ERRNOS = {2, 19, 22}  # ENOENT, ENODEV, EINVAL (no such qdisc / device)


def _ns_exists(netns: str | None) -> bool:
    return netns is None or os.path.exists(os.path.join(NETNS_DIR, netns))


def remove_resource(kind: str, name: str, netns: str | None) -> bool:
    """Remove one recorded resource; True when something was removed, False when already gone.

    Raises :class:`ValueError` for an unknown kind and :class:`netem.NetnsError` when a removal
    fails for another reason than the resource being gone.
    """
    if kind == "process":
        pid_s, _, tag = name.partition(" ")
        return kill_delay_line(int(pid_s), tag)
    if not _ns_exists(netns):
        return False  # the namespace, and everything in it, is already gone
    if kind == "qdisc":
        ifname, _, where = name.partition(" ")
        with ipr(netns) as ip:
            idx = ip.link_lookup(ifname=ifname)
            if not idx:
                return False
            try:
                if where == "ingress":
                    ip.tc("del", index=idx[0], handle=INGRESS_HANDLE, parent=TC_H_INGRESS)
                else:
                    ip.tc("del", index=idx[0], handle=ROOT_HANDLE, parent=TC_H_ROOT)
            except NetlinkError as e:
                if e.code in _GONE_ERRNOS:
                    return False
                raise NetnsError(f"deleting qdisc {name} in {netns or 'host'}: {e}") from e
        return True
    if kind == "link":
        with ipr(netns) as ip:
            if not ip.link_lookup(ifname=name):
                return False
            ip.link("del", ifname=name)
        return True
    if kind == "nft-table":
        family, _, table = name.partition(" ")
        if name == "ip mangle":
            # iptables-nft's table, made when our first chain went in: removed only once no
            # chain or rule of anyone is left in it (another shaping may still use it).
            listing = run(netns, ["iptables", "-t", "mangle", "-S"], check=False)
            if any(not ln.startswith("-P ") for ln in listing.stdout.splitlines() if ln):
                return False
        res = run(netns, ["nft", "delete", "table", family, table], check=False)
        if res.returncode != 0:
            if "No such file" in res.stderr:
                return False
            raise NetnsError(f"nft delete table {name} in {netns or 'host'}: {res.stderr.strip()}")
        return True
    if kind == "iptables-chain":
        table, _, chain = name.partition(" ")
        return _remove_chain(netns, table, chain)
    raise ValueError(f"unknown shaping resource kind {kind!r}")


def _remove_chain(netns: str | None, table: str, chain: str) -> bool:
    listing = run(netns, ["iptables", "-t", table, "-S"], check=False)
    if listing.returncode != 0 or f"-N {chain}" not in listing.stdout.split("\n"):
        return False
    for line in listing.stdout.splitlines():
        parts = line.split()
        if parts[:1] == ["-A"] and parts[-2:] == ["-j", chain]:
            run(netns, ["iptables", "-t", table, "-D", *parts[1:]])
    run(netns, ["iptables", "-t", table, "-F", chain])
    run(netns, ["iptables", "-t", table, "-X", chain])
    return True


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _tag_of(argv: list[str]) -> str | None:
    if DELAYLINE_MODULE not in argv or "--tag" not in argv:
        return None
    i = argv.index("--tag")
    return argv[i + 1] if i + 1 < len(argv) else None


def delay_line_processes(prefix: str = "zw-") -> Iterator[tuple[int, str]]:
    """(pid, tag) of every running delay line whose tag starts with ``prefix``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            tag = _tag_of(_cmdline(int(entry)))
            if tag is not None and tag.startswith(prefix):
                yield int(entry), tag


def kill_delay_line(pid: int, tag: str, timeout_s: float = 3.0) -> bool:
    """SIGTERM (then SIGKILL) the delay line ``pid`` if it is still the one tagged ``tag``."""
    if _tag_of(_cmdline(pid)) != tag:
        return False  # exited, or the pid now belongs to another process: leave it alone
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _tag_of(_cmdline(pid)) != tag:
            return True
        time.sleep(0.02)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True


def _zw_netns(prefix: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(NETNS_DIR) if n.startswith(prefix))
    except FileNotFoundError:
        return []


def _netns_inode(netns: str | None) -> int | None:
    try:
        return os.stat(os.path.join(NETNS_DIR, netns) if netns else "/proc/1/ns/net").st_ino
    except OSError:
        return None


def _process_netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def leftovers(
    prefix: str = "zw-", namespaces: list[str | None] | None = None
) -> list[tuple[str, str, str | None]]:
    """Shaping resources named ``prefix*``, as ``(kind, name, netns)``.

    Looked for in ``namespaces`` (None in the list: the host's), by default the host namespace
    and every ``prefix*`` namespace. Only resources whose own name carries the prefix are listed
    (a root/ingress qdisc only on an interface named ``prefix*``), so nothing the toolkit did not
    create is touched. Delay-line processes are listed when they run in one of those namespaces.
    """
    spaces = [None, *_zw_netns(prefix)] if namespaces is None else list(namespaces)
    inodes = {_netns_inode(ns): ns for ns in spaces}
    inodes.pop(None, None)
    found: list[tuple[str, str, str | None]] = []
    for pid, tag in delay_line_processes(prefix):
        ino = _process_netns_inode(pid)
        if ino in inodes or namespaces is None:
            found.append(("process", f"{pid} {tag}", inodes.get(ino)))
    for netns in spaces:
        if not _ns_exists(netns):
            continue
        try:
            found.extend(_leftovers_in(netns, prefix))
        except NetnsError:
            continue  # namespace vanished meanwhile
    return found


def _leftovers_in(netns: str | None, prefix: str) -> list[tuple[str, str, str | None]]:
    found: list[tuple[str, str, str | None]] = []
    if shutil.which("iptables"):
        listing = run(netns, ["iptables", "-t", "mangle", "-S"], check=False).stdout
        for line in listing.splitlines():
            parts = line.split()
            if parts[:1] == ["-N"] and parts[1].startswith(prefix):
                found.append(("iptables-chain", f"mangle {parts[1]}", netns))
    if shutil.which("nft"):
        tables = run(netns, ["nft", "list", "tables"], check=False).stdout
        for line in tables.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == "table" and parts[2].startswith(prefix):
                found.append(("nft-table", f"{parts[1]} {parts[2]}", netns))
    with ipr(netns) as ip:
        for link in ip.get_links():
            name = link.get_attr("IFLA_IFNAME")
            if not name or not name.startswith(prefix):
                continue
            if name.startswith(f"{prefix}ifb-"):
                found.append(("link", name, netns))
                continue
            for q in ip.get_qdiscs(index=link["index"]):
                if q["parent"] == TC_H_ROOT and q["handle"] == ROOT_HANDLE:
                    found.append(("qdisc", f"{name} root", netns))
                elif q["parent"] == TC_H_INGRESS:
                    found.append(("qdisc", f"{name} ingress", netns))
    return found


def clean_all(
    prefix: str = "zw-", namespaces: list[str | None] | None = None
) -> list[tuple[str, str, str | None]]:
    """Remove every shaping leftover named ``prefix*`` (see :func:`leftovers` for where it looks
    and for ``namespaces``); returns what it removed.

    Delay-line processes go first (a process keeps its namespace alive), then rules and qdiscs.
    Errors on one resource do not stop the others; they are raised together at the end as a
    :class:`netem.NetnsError`.
    """
    if not prefix:
        raise ValueError("clean_all needs a non-empty prefix")
    removed: list[tuple[str, str, str | None]] = []
    errors: list[str] = []
    for kind, name, netns in leftovers(prefix, namespaces):
        try:
            if remove_resource(kind, name, netns):
                removed.append((kind, name, netns))
        except (NetnsError, NetlinkError, OSError) as e:
            errors.append(f"{kind} {name} ({netns or 'host'}): {e}")
    if errors:
        raise NetnsError("clean-up left resources behind: " + "; ".join(errors))
    return removed
