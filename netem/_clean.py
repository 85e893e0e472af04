"""``zerowindow netem clean``: remove what crashed or SIGKILLed runs left behind.

Two sources, both used: the state files (``netem-state.json`` in run folders under the
results folder, and their copies in ``/run/zerowindow/``), which name each resource and each
process a run created; and the ``zw-`` prefix, which finds namespaces, root-namespace
interfaces and nftables tables no state file names. Resources of a run whose owning process
still runs are left alone (unless ``force``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from netem._netns import PREFIX, list_netns, process_alive, require_net_admin
from netem._nsexec import NetnsError
from netem._resources import delay_line_processes, kill_delay_line, leftovers, remove_resource
from netem._state import RUNTIME_DIR, STATE_NAME, owner_alive, read_state
from netem._topology import destroy_resources

_RUN_ID = re.compile(rf"^{re.escape(PREFIX)}([0-9a-z]+)-")


@dataclass
class CleanReport:
    """What :func:`clean` removed, and the runs it left alone because they are still alive."""

    removed: list[str] = field(default_factory=list)
    skipped_live_runs: list[str] = field(default_factory=list)
    state_files: list[str] = field(default_factory=list)
    skipped_unrecorded: list[str] = field(default_factory=list)
    """``zw-`` resources no state file accounts for, left alone (``unrecorded=False``)."""


def run_id_of(name: str) -> str | None:
    """The run id in a ``zw-<id>-...`` name, or ``None``."""
    match = _RUN_ID.match(name)
    return match.group(1) if match else None


def _state_files(results: Path | None) -> list[Path]:
    files = sorted(RUNTIME_DIR.glob("*.json")) if RUNTIME_DIR.is_dir() else []
    if results is not None and results.is_dir():
        files += sorted(results.rglob(STATE_NAME))
    return files


def _kill_process(res: dict[str, Any]) -> bool:
    pid = res.get("pid")
    if not isinstance(pid, int) or not process_alive(pid, res.get("start_ticks")):
        return False
    try:
        os.killpg(pid, signal.SIGKILL) if res.get("group") else os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _nft_tables() -> list[tuple[str, str]]:
    """(family, name) of the root namespace's nftables tables; empty without ``nft``."""
    nft = shutil.which("nft")
    if nft is None:
        return []
    out = subprocess.run([nft, "-j", "list", "tables"], capture_output=True, text=True)
    if out.returncode != 0:
        return []
    tables = []
    for item in json.loads(out.stdout).get("nftables", []):
        if "table" in item:
            tables.append((item["table"]["family"], item["table"]["name"]))
    return tables


def _delete_nft_table(family: str, name: str) -> bool:
    nft = shutil.which("nft")
    if nft is None:
        return False
    done = subprocess.run([nft, "delete", "table", family, name], capture_output=True)
    return done.returncode == 0


def _remove_root_qdisc(res: dict[str, Any]) -> bool:
    """Delete a recorded root qdisc on a root-namespace interface (ones inside a run's
    namespaces go with the namespace)."""
    ifname = res.get("ifname")
    if res.get("netns") is not None or not isinstance(ifname, str):
        return False
    with IPRoute() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return False
        try:
            ipr.tc("del", index=found[0], handle=res.get("handle", 0), parent=res.get("parent"))
        except Exception:
            return False
    return True


def clean_state(state: dict[str, Any]) -> list[str]:
    """Release everything one state file names: processes first, then nftables tables and
    qdiscs in the root namespace, then links and namespaces. Returns what was removed."""
    removed: list[str] = []
    resources = list(state.get("resources", []))
    for res in resources:
        if res.get("kind") == "process" and _kill_process(res):
            removed.append(f"process {res['pid']} ({res.get('what') or 'run process'})")
    # Shaping resources (delay lines first: a process keeps its namespace alive).
    shaping = [r for r in resources if r.get("kind") == "shaping"]
    shaping.sort(key=lambda r: r.get("shaping_kind") != "process")
    for res in shaping:
        try:
            if remove_resource(res["shaping_kind"], res["name"], res.get("netns")):
                removed.append(f"{res['shaping_kind']} {res['name']}")
        except (NetnsError, OSError, ValueError):
            pass  # its namespace goes below, and everything in it
    for res in resources:
        if res.get("kind") == "nft_table" and res.get("netns") is None:
            if _delete_nft_table(res.get("family", "inet"), res["name"]):
                removed.append(f"nft table {res['name']}")
        elif res.get("kind") == "qdisc" and _remove_root_qdisc(res):
            removed.append(f"qdisc on {res['ifname']}")
    removed += destroy_resources(resources)
    return removed


def _mark_cleaned(path: Path, state: dict[str, Any]) -> None:
    if path.parent == RUNTIME_DIR:
        path.unlink(missing_ok=True)
    else:
        state["status"] = "cleaned"
        path.write_text(json.dumps(state, indent=2) + "\n")


def clean(
    *,
    results: Path | None = Path("results"),
    run_id: str | None = None,
    force: bool = False,
    unrecorded: bool = False,
) -> CleanReport:
    """Remove what dead runs left: everything their state files name, then the ``zw-``
    namespaces, root-namespace interfaces and nftables tables named after those runs.

    ``run_id`` limits the work to that run's resources (found by its name whether or not a
    state file records the run). ``force`` also cleans runs whose owner still runs.
    ``unrecorded`` also removes ``zw-`` resources that no state file accounts for (a run
    whose state file is lost, or one of another job on this machine, with its own results
    folder: hence not by default); without it they are listed in ``skipped_unrecorded``.
    Raises :class:`~netem._netns.NetemPermissionError` without CAP_NET_ADMIN.
    """
    require_net_admin("zerowindow netem clean")
    cleaner = _Cleaner(run_id=run_id, force=force, unrecorded=unrecorded)
    cleaner.by_state_files(results)
    # By prefix: what no state file named (or a state file that was lost).
    cleaner.namespaces_and_links()
    if run_id is None:
        cleaner.by_shaping_tag()
    cleaner.nft_tables()
    cleaner.report.skipped_live_runs = sorted(cleaner.live)
    return cleaner.report


@dataclass
class _Cleaner:
    """The steps of one :func:`clean`, in the order it takes them, and what they found."""

    run_id: str | None
    force: bool
    unrecorded: bool
    report: CleanReport = field(default_factory=CleanReport)
    live: set[str] = field(default_factory=set)  # ids of runs whose owner still runs
    live_names: set[str] = field(default_factory=set)  # their resources and delay-line tags
    done: set[str] = field(default_factory=set)  # ids of runs cleaned by their state files

    def by_state_files(self, results: Path | None) -> None:
        """Release what each dead run's state file names (runtime copies and run folders)."""
        for path in _state_files(results):
            state = read_state(path)
            if state is None or state.get("status") == "cleaned":
                continue
            rid = str(state["run_id"])
            if self.run_id is not None and rid != self.run_id:
                continue
            if rid in self.done:  # the run folder's copy of a runtime state file already cleaned
                _mark_cleaned(path, state)
                continue
            if owner_alive(state) and not self.force:
                self.live.add(rid)
                for res in state.get("resources", []):
                    name = str(res.get("name", ""))
                    self.live_names.update({name, name.partition(" ")[2]})
                continue
            if state.get("status") != "released":
                self.report.removed += clean_state(state)
            self.report.state_files.append(str(path))
            self.done.add(rid)
            _mark_cleaned(path, state)

    def wanted(self, name: str) -> bool:
        """Whether a ``zw-`` name found on the machine is to go (an unrecorded one that is not
        is listed in the report's ``skipped_unrecorded``)."""
        rid = run_id_of(name)
        if not name.startswith(PREFIX) or (rid is not None and rid in self.live):
            return False
        if self.run_id is not None:
            return rid == self.run_id
        if rid in self.done or self.unrecorded:
            return True
        self.report.skipped_unrecorded.append(name)
        return False

    def namespaces_and_links(self) -> None:
        """Remove the wanted ``zw-`` namespaces, then root-namespace interfaces."""
        report = self.report
        for name in list_netns():
            if self.wanted(name):
                report.removed += destroy_resources([{"kind": "netns", "name": name}])
        with IPRoute() as ipr:
            for link in ipr.get_links():
                name = link.get("ifname") or ""
                if self.wanted(name):
                    try:
                        ipr.link("del", index=link["index"])
                    except NetlinkError:
                        continue  # gone with its veth peer
                    report.removed.append(f"link {name}")

    def by_shaping_tag(self) -> None:
        """Delay lines and host-side shaping named by a shaping tag (zw-<hash>) rather than a
        run id: what a dead run's state file named went with it before; the rest is
        unrecorded (removed only with ``unrecorded``)."""
        report = self.report
        for kind, name, netns in leftovers(PREFIX, namespaces=[None]):
            if name in self.live_names:
                continue
            if not self.unrecorded:
                report.skipped_unrecorded.append(f"{kind} {name}")
                continue
            try:
                if remove_resource(kind, name, netns):
                    report.removed.append(f"{kind} {name}")
            except (NetnsError, OSError):
                pass
        for pid, tag in delay_line_processes(PREFIX):
            if tag in self.live_names:
                continue
            if not self.unrecorded:
                report.skipped_unrecorded.append(f"delay line {pid} ({tag})")
            elif kill_delay_line(pid, tag):
                report.removed.append(f"delay line {pid} ({tag})")

    def nft_tables(self) -> None:
        """Delete the wanted ``zw-`` nftables tables of the root namespace."""
        for family, name in _nft_tables():
            if self.wanted(name) and _delete_nft_table(family, name):
                self.report.removed.append(f"nft table {name}")
