"""What this kernel and machine can do for shaping, probed once per process.

Each feature is tried for real in a throw-away network namespace (``zw-probe-<pid>``), never on
an interface of the host, and the namespace is deleted afterwards. Results are cached for the
life of the process (:func:`probe_kernel`); ``refresh=True`` probes again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from functools import cache

from netem._errors import ProbeError
from netem._nsexec import NetnsError, ipr, run

TC_H_ROOT = 0xFFFFFFFF
TC_H_INGRESS = 0xFFFFFFF1
INGRESS_HANDLE = 0xFFFF0000

# Kernel config options behind each feature, for error messages.
KCONFIG = {
    "netem": "sch_netem (CONFIG_NET_SCH_NETEM)",
    "tbf": "sch_tbf (CONFIG_NET_SCH_TBF)",
    "htb": "sch_htb (CONFIG_NET_SCH_HTB)",
    "ingress": "sch_ingress (CONFIG_NET_SCH_INGRESS)",
    "ifb": "ifb device (CONFIG_IFB)",
    "u32_mirred": "cls_u32 + act_mirred (CONFIG_NET_CLS_U32, CONFIG_NET_ACT_MIRRED)",
    "nft_numgen": "nftables with numgen (nft command, CONFIG_NF_TABLES, CONFIG_NFT_NUMGEN)",
    "nft_queue": "nftables queue (CONFIG_NFT_QUEUE)",
    "iptables_statistic": "iptables statistic match (iptables command, "
    "CONFIG_NETFILTER_XT_MATCH_STATISTIC)",
    "iptables_nfqueue": "iptables NFQUEUE target (iptables command, "
    "CONFIG_NETFILTER_XT_TARGET_NFQUEUE, CONFIG_NETFILTER_NETLINK_QUEUE)",
    "nfqueue_binding": "the netfilterqueue Python package (libnetfilter-queue)",
    "tcpdump": "the tcpdump command (Debian package tcpdump)",
}


@dataclass(frozen=True)
class KernelFeatures:
    """Which shaping features work here (True = tried and worked)."""

    netem: bool
    tbf: bool
    htb: bool
    ingress: bool
    ifb: bool
    u32_mirred: bool
    nft_numgen: bool
    nft_queue: bool
    iptables_statistic: bool
    iptables_nfqueue: bool
    nfqueue_binding: bool
    tcpdump: bool
    kernel: str
    errors: tuple[tuple[str, str], ...] = ()

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["errors"] = dict(self.errors)
        return d

    def missing(self, *names: str) -> list[str]:
        """Human names (with kernel config options) of the features among ``names`` absent."""
        return [KCONFIG[n] for n in names if not getattr(self, n)]


def _try(errors: dict[str, str], name: str, fn: object) -> bool:
    try:
        fn()  # type: ignore[operator]
        return True
    except Exception as e:  # noqa: BLE001 - the reason is recorded
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().strip("^")]
        errors[name] = lines[0] if lines else type(e).__name__
        return False


def _probe(ns: str) -> KernelFeatures:
    errors: dict[str, str] = {}
    with ipr(ns) as ip:
        ip.link("set", index=ip.link_lookup(ifname="lo")[0], state="up")
        lo = ip.link_lookup(ifname="lo")[0]

        def qdisc(kind: str, **kw: object) -> None:
            ip.tc("add", kind, lo, 0x10000, **kw)
            ip.tc("del", index=lo, handle=0x10000, parent=TC_H_ROOT)

        netem = _try(errors, "netem", lambda: qdisc("netem", delay=10000))
        tbf = _try(errors, "tbf", lambda: qdisc("tbf", rate="1mbit", burst=3028,
                                                latency="50ms"))
        htb = _try(errors, "htb", lambda: qdisc("htb", default=1))
        ingress = _try(errors, "ingress", lambda: (
            ip.tc("add", "ingress", lo, "ffff:"),
            ip.tc("del", index=lo, handle=INGRESS_HANDLE, parent=TC_H_INGRESS)))

        def ifb_and_mirred() -> None:
            ip.link("add", ifname="zw-probe-ifb", kind="ifb")
            try:
                ifb_idx = ip.link_lookup(ifname="zw-probe-ifb")[0]
                ip.tc("add", "ingress", lo, "ffff:")
                ip.tc("add-filter", "u32", lo, parent="ffff:", protocol=0x0003, prio=10,
                      keys=["0x0/0x0+0"], target=0x10000,
                      action={"kind": "mirred", "direction": "egress", "action": "redirect",
                              "ifindex": ifb_idx})
                ip.tc("del", index=lo, handle=INGRESS_HANDLE, parent=TC_H_INGRESS)
            finally:
                ip.link("del", ifname="zw-probe-ifb")

        ifb = _try(errors, "ifb", lambda: (ip.link("add", ifname="zw-probe-ifb0", kind="ifb"),
                                           ip.link("del", ifname="zw-probe-ifb0")))
        u32_mirred = ifb and ingress and _try(errors, "u32_mirred", ifb_and_mirred)

    def nft(ruleset: str) -> None:
        if not shutil.which("nft"):
            raise NetnsError("nft: command not found")
        run(ns, ["nft", "-f", "-"], input=ruleset)
        run(ns, ["nft", "delete", "table", "inet", "zw-probe"])

    base = "table inet zw-probe {\n chain c { type filter hook postrouting priority 0;\n"
    nft_numgen = _try(errors, "nft_numgen", lambda: nft(
        base + '  oifname "lo" numgen random mod 100 < 5 drop\n }\n}\n'))
    nft_queue = _try(errors, "nft_queue", lambda: nft(
        base + '  oifname "lo" queue num 7\n }\n}\n'))

    def ipt(rule: list[str]) -> None:
        if not shutil.which("iptables"):
            raise NetnsError("iptables: command not found")
        run(ns, ["iptables", "-t", "mangle", "-A", "POSTROUTING", "-o", "lo", *rule])

    ipt_stat = _try(errors, "iptables_statistic", lambda: ipt(
        ["-m", "statistic", "--mode", "random", "--probability", "0.05", "-j", "DROP"]))
    ipt_nfq = _try(errors, "iptables_nfqueue", lambda: ipt(
        ["-j", "NFQUEUE", "--queue-num", "7"]))

    def binding() -> None:
        # Bind a queue for real, in the namespace, as the delay line does.
        run(ns, [sys.executable, "-c",
                 "from netfilterqueue import NetfilterQueue as Q\n"
                 "q = Q(); q.bind(7, lambda p: None); q.unbind()"])

    nfq_bind = _try(errors, "nfqueue_binding", binding)
    return KernelFeatures(
        netem=netem, tbf=tbf, htb=htb, ingress=ingress, ifb=ifb, u32_mirred=u32_mirred,
        nft_numgen=nft_numgen, nft_queue=nft_queue, iptables_statistic=ipt_stat,
        iptables_nfqueue=ipt_nfq, nfqueue_binding=nfq_bind,
        tcpdump=shutil.which("tcpdump") is not None, kernel=os.uname().release,
        errors=tuple(sorted(errors.items())),
    )


@cache
def _cached() -> KernelFeatures:
    return _probe_fresh()


def _probe_fresh() -> KernelFeatures:
    if os.geteuid() != 0:
        raise ProbeError("shaping needs CAP_NET_ADMIN (run as root): cannot probe the kernel")
    ns = f"zw-probe-{os.getpid()}"
    try:
        subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise ProbeError("the `ip` command (iproute2) is missing") from e
    except subprocess.CalledProcessError as e:
        raise ProbeError(f"cannot create probe namespace {ns}: {e.stderr.strip()}") from e
    try:
        return _probe(ns)
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def probe_kernel(refresh: bool = False) -> KernelFeatures:
    """The shaping features of this machine, probed once per process (see module doc).

    Raises :class:`ProbeError` without CAP_NET_ADMIN.
    """
    if refresh:
        _cached.cache_clear()
    return _cached()
