"""What shaping is in force on an interface: qdiscs, nftables/iptables rules, delay lines."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field

from netem._nsexec import ipr, run
from netem._resources import delay_line_processes
from netem._shaping import shaping_tag


@dataclass(frozen=True)
class QdiscInfo:
    """One qdisc: the ``tc -s qdisc show`` figures (bytes/packets sent, drops, backlog)."""

    ifname: str
    kind: str
    handle: str
    parent: str
    sent_bytes: int
    sent_packets: int
    drops: int
    backlog_bytes: int


@dataclass(frozen=True)
class ShapingState:
    """Shaping state of ``ifname`` in ``netns``: its qdiscs and those of its IFB device, the
    ``zw-`` nftables tables and iptables chains of that namespace (as ``nft``/``iptables``
    print them), and the delay-line processes (pid, tag) of this interface's shaping."""

    netns: str | None
    ifname: str
    qdiscs: list[QdiscInfo] = field(default_factory=list)
    nft_tables: dict[str, str] = field(default_factory=dict)
    iptables_rules: list[str] = field(default_factory=list)
    delay_lines: list[tuple[int, str]] = field(default_factory=list)

    @property
    def shaped(self) -> bool:
        return bool(
            any(q.kind not in ("noqueue", "pfifo_fast", "fq_codel") for q in self.qdiscs)
            or self.nft_tables or self.iptables_rules or self.delay_lines
        )


def _handle(h: int) -> str:
    return f"{h >> 16:x}:{h & 0xFFFF:x}" if h != 0xFFFFFFFF else "root"


def show(netns: str | None, ifname: str) -> ShapingState:
    """Describe the shaping on ``ifname`` in ``netns`` (None: host); reads only."""
    tag = shaping_tag(netns, ifname)
    ifb = f"zw-ifb-{tag[3:9]}"
    qdiscs: list[QdiscInfo] = []
    with ipr(netns) as ip:
        for name in (ifname, ifb):
            idx = ip.link_lookup(ifname=name)
            if not idx:
                continue
            for q in ip.get_qdiscs(index=idx[0]):
                stats = q.get_attr("TCA_STATS") or {}
                qdiscs.append(QdiscInfo(
                    ifname=name, kind=str(q.get_attr("TCA_KIND")), handle=_handle(q["handle"]),
                    parent=_handle(q["parent"]), sent_bytes=int(stats.get("bytes", 0)),
                    sent_packets=int(stats.get("packets", 0)), drops=int(stats.get("drop", 0)),
                    backlog_bytes=int(stats.get("backlog", 0)),
                ))
    tables: dict[str, str] = {}
    if shutil.which("nft"):
        listing = run(netns, ["nft", "list", "tables"], check=False).stdout
        for line in listing.splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[2].startswith("zw-"):
                tables[f"{parts[1]} {parts[2]}"] = run(
                    netns, ["nft", "list", "table", parts[1], parts[2]], check=False).stdout
    rules: list[str] = []
    if shutil.which("iptables"):
        listing = run(netns, ["iptables", "-t", "mangle", "-S"], check=False).stdout
        rules = [ln for ln in listing.splitlines() if " zw-" in ln]
    lines = list(delay_line_processes(f"zw-dl-{tag[3:9]}-"))
    return ShapingState(netns=netns, ifname=ifname, qdiscs=qdiscs, nft_tables=tables,
                        iptables_rules=rules, delay_lines=lines)
