"""Network-namespace primitives: the capability check, running code or programs inside a
namespace, per-namespace sysctls and the processes a namespace holds.

Namespaces are the named ones of ``ip netns`` (bind mounts under ``/run/netns``), created and
removed through pyroute2 (``pyroute2.netns``). Entering one for a moment is done in a
short-lived thread: ``setns(2)`` with ``CLONE_NEWNET`` moves only the calling thread, and
sockets and ``/proc/sys/net`` files opened there belong to that namespace for their whole life
(setns(2), proc(5): ``/proc/sys/net`` shows the opener's network namespace).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pyroute2 import netns as _pr_netns

from netem._errors import NetemError, NetemPermissionError

# Linux capability number of CAP_NET_ADMIN (include/uapi/linux/capability.h).
CAP_NET_ADMIN = 12
# Every name the toolkit gives a namespace, interface or nftables table starts with this.
PREFIX = "zw-"
NETNS_DIR = Path("/run/netns")

T = TypeVar("T")


def has_net_admin() -> bool:
    """Whether this process's effective capability set holds CAP_NET_ADMIN (read from the
    ``CapEff`` line of ``/proc/self/status``, proc(5))."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> CAP_NET_ADMIN & 1)
    return os.geteuid() == 0


def require_net_admin(what: str) -> None:
    """Raise :class:`NetemPermissionError` naming CAP_NET_ADMIN unless this process has it."""
    if not has_net_admin():
        raise NetemPermissionError(
            f"{what} needs the CAP_NET_ADMIN capability (run as root, or grant it with "
            "`setcap cap_net_admin+ep` / a container's --cap-add NET_ADMIN)"
        )


def list_netns() -> list[str]:
    """Names of the named network namespaces (``ip netns list``)."""
    return sorted(_pr_netns.listnetns())


def create_netns(name: str) -> None:
    """Create the named network namespace ``name``. Raises :class:`NetemError` if it exists
    or cannot be created."""
    if name in list_netns():
        raise NetemError(f"network namespace {name} already exists")
    try:
        _pr_netns.create(name)
    except OSError as exc:
        raise NetemError(f"cannot create network namespace {name}: {exc}") from exc


def remove_netns(name: str) -> None:
    """Remove the named namespace (its mount); a namespace that is gone is fine. Interfaces
    inside it are destroyed by the kernel once no process holds it."""
    if name in list_netns():
        _pr_netns.remove(name)


def run_in_netns(name: str, fn: Callable[[], T]) -> T:
    """Run ``fn()`` in a thread that has entered network namespace ``name``; return its result
    or re-raise its exception. Raises :class:`NetemError` if the namespace cannot be entered."""
    result: list[T] = []
    error: list[BaseException] = []

    def body() -> None:
        try:
            _pr_netns.setns(name, flags=0)
        except OSError as exc:
            error.append(NetemError(f"cannot enter network namespace {name}: {exc}"))
            return
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the caller
            error.append(exc)

    thread = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def set_sysctls(name: str, values: dict[str, str]) -> dict[str, str]:
    """Write ``values`` (``{"net.ipv4.tcp_wmem": "4096 16384 65536"}``) inside namespace
    ``name``; return the values read back. Raises :class:`NetemError` naming the key for one
    the kernel refuses."""

    def write() -> dict[str, str]:
        out = {}
        for key, value in values.items():
            path = Path("/proc/sys") / key.replace(".", "/")
            try:
                path.write_text(value)
                out[key] = " ".join(path.read_text().split())
            except OSError as exc:
                raise NetemError(f"sysctl {key}={value!r} in {name}: {exc.strerror}") from None
        return out

    return run_in_netns(name, write)


def exec_prefix(name: str | None) -> list[str]:
    """The argv prefix that starts a program inside namespace ``name`` (``ip netns exec``,
    ip-netns(8)); empty for ``None`` (the current namespace)."""
    return [] if name is None else ["ip", "netns", "exec", name]


def netns_pids(name: str) -> list[int]:
    """Pids of the processes whose network namespace is ``name`` (compared by inode of
    ``/proc/<pid>/ns/net``)."""
    try:
        inode = (NETNS_DIR / name).stat().st_ino
    except OSError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "ns" / "net").stat().st_ino == inode:
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_netns_processes(name: str) -> list[int]:
    """SIGKILL every process inside namespace ``name``; return their pids."""
    pids = netns_pids(name)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return pids


def process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (field 22 of
    ``/proc/<pid>/stat``, proc(5)), or ``None`` if it does not exist. With the pid it
    identifies a process even after pids are reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def process_alive(pid: int, start_ticks: int | None) -> bool:
    """Whether the process ``pid`` that started at ``start_ticks`` still runs."""
    now = process_start_ticks(pid)
    return now is not None and (start_ticks is None or now == start_ticks)
