"""The ``fallback`` shaping backend, for kernels without netem: tbf, nftables, NFQUEUE.

Rate: ``tbf``; loss: an nftables ``numgen random`` drop rule in table ``inet zw-shape-*`` (or the
iptables ``statistic`` match when nft is missing); delay, jitter and reorder: a userspace delay
line (:mod:`netem._delayline`, NFQUEUE) on arriving packets, carrying both directions' delay.
``duplicate_pct``, ``corrupt_pct`` and ``up.reorder_pct`` are not available. Registered in
:data:`netem._shaping.BACKENDS` as ``fallback``; :class:`FallbackBackend` says where each part
goes and why.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
from pathlib import Path

from netem._errors import ShapingError
from netem._nsexec import ns_argv, run
from netem._probe import KCONFIG, KernelFeatures
from netem._profiles import DirectionProfile, LinkProfile
from netem._resources import DELAYLINE_MODULE
from netem._shaping import BACKENDS, _Applier, tbf_options
from zwcore import reap_on_exit

_READY_TIMEOUT_S = 15.0


@BACKENDS.register
class FallbackBackend:
    """tbf + nftables loss + NFQUEUE delay line, for kernels without netem (see module doc).

    Placement, and why:

    * Rate: ``down`` on an IFB device fed by the interface's ingress; ``up`` on an IFB device fed
      by the peer interface's ingress when ``apply_profile`` is given ``peer``, else as the
      interface's root qdisc (inside the client's stack, where TCP Small Queues keep only ~2 skbs
      of a socket in it; see :func:`apply_profile`).
    * Loss: nftables ``numgen random`` drops in table ``inet zw-shape-*``: ``down`` at prerouting
      (``iifname``); ``up`` at the peer's prerouting with ``peer``, else at the client's
      postrouting (``oifname``), inside the client's own stack: a local TCP sender then sees a
      failed transmit and retries (netem hides such drops from the sender), a UDP sender gets
      EPERM.
    * Delay, jitter, reorder: one delay line on the interface's *ingress* (PREROUTING), holding
      arriving packets for ``down.delay_ms + up.delay_ms`` (jitter: the sum of both jitters).
      The round-trip time TCP sees is the profile's; the split between the directions is not
      reproduced. A delay line on egress would hold the sender's own skbs, and TCP Small Queues
      (``tcp_small_queue_check``) then lets only ~2 segments per socket sit below TCP: measured
      on this kernel, a bulk upload through a 100 ms egress delay line ran at 281 kbit/s. On
      ingress the skbs come off the veth already orphaned, so no such cap applies.
      ``up.reorder_pct`` therefore has no fallback; ``down.reorder_pct`` has.
    """

    kind = "fallback"

    def missing(self, profile: LinkProfile, f: KernelFeatures, netns: str | None) -> list[str]:
        out: list[str] = []
        for name, d in (("down", profile.down), ("up", profile.up)):
            for fld in ("duplicate_pct", "corrupt_pct"):
                if getattr(d, fld):
                    out.append(f"{name}.{fld} needs {KCONFIG['netem']}")
            if d.rate_kbit:
                out += f.missing("tbf")
            if d.loss_pct and not (f.nft_numgen or f.iptables_statistic):
                out += f.missing("nft_numgen", "iptables_statistic")
        if profile.up.reorder_pct:
            out.append(f"up.reorder_pct needs {KCONFIG['netem']} (the fallback delay line "
                       "works on arriving packets only)")
        if profile.down.rate_kbit:
            out += f.missing("ifb", "ingress", "u32_mirred")
        if profile.down.needs_delay_line or profile.up.needs_delay_line:
            out += f.missing("iptables_nfqueue", "nfqueue_binding")
            if netns is None:
                out.append(
                    "delay_ms/jitter_ms/reorder_pct on the fallback backend need a network "
                    "namespace the run created (the delay line's NFQUEUE rule goes into that "
                    "namespace's iptables mangle table, never the host's)"
                )
        return list(dict.fromkeys(out))

    def apply(self, profile: LinkProfile, a: _Applier) -> None:
        f = a.features
        ifname = a.s.ifname
        up, down = profile.up, profile.down
        use_nft = f.nft_numgen
        peer = a.s.peer
        if up.rate_kbit and peer:
            ifb_u, ns_u = a.ingress_ifb(on_peer=True)
            a.root_qdisc(ifb_u, "tbf", ns_u, **tbf_options(up.rate_kbit))
        elif up.rate_kbit:
            a.root_qdisc(ifname, "tbf", **tbf_options(up.rate_kbit))
        if down.rate_kbit:
            ifb, _ = a.ingress_ifb()
            a.root_qdisc(ifb, "tbf", **tbf_options(down.rate_kbit))
        if use_nft and peer and up.loss_pct:
            self._nft_loss(a, 0.0, down.loss_pct)
            self._nft_loss(a, up.loss_pct, 0.0, on_peer=True)
        elif use_nft and (up.loss_pct or down.loss_pct):
            self._nft_loss(a, up.loss_pct, down.loss_pct)
        if not use_nft and up.loss_pct:
            self._iptables_chain(a, "up", None, up.loss_pct)
        line = None
        if up.needs_delay_line or down.needs_delay_line:
            line = DirectionProfile(
                delay_ms=up.delay_ms + down.delay_ms, jitter_ms=up.jitter_ms + down.jitter_ms,
                reorder_pct=down.reorder_pct,
            )
        stat_loss = down.loss_pct if not use_nft else 0.0
        if line is not None or stat_loss:
            self._iptables_chain(a, "down", line, stat_loss)

    @staticmethod
    def _nft_loss(a: _Applier, up_pct: float, down_pct: float, on_peer: bool = False) -> None:
        if not (up_pct or down_pct):
            return
        table = f"zw-shape-{a.s.tag[3:9]}"
        rules = [f"table inet {table} {{"]
        # priority -300: before conntrack and the mangle table's NFQUEUE jump
        if on_peer:  # up packets as they arrive on the peer: a drop on the wire
            assert a.s.peer is not None
            ns, peer_if = a.s.peer
            rules += [" chain up { type filter hook prerouting priority -300;",
                      f'  iifname "{peer_if}" numgen random mod 1000000 < '
                      f"{round(up_pct * 10000)} counter drop", " }", "}"]
            run(ns, ["nft", "add", "table", "inet", table])
            a.created("nft-table", f"inet {table}", ns)
            run(ns, ["nft", "-f", "-"], input="\n".join(rules) + "\n")
            return
        if up_pct:
            rules += [" chain up { type filter hook postrouting priority -300;",
                      f'  oifname "{a.s.ifname}" numgen random mod 1000000 < '
                      f"{round(up_pct * 10000)} counter drop", " }"]
        if down_pct:
            rules += [" chain down { type filter hook prerouting priority -300;",
                      f'  iifname "{a.s.ifname}" numgen random mod 1000000 < '
                      f"{round(down_pct * 10000)} counter drop", " }"]
        rules.append("}")
        run(a.netns, ["nft", "add", "table", "inet", table])
        a.created("nft-table", f"inet {table}")
        run(a.netns, ["nft", "-f", "-"], input="\n".join(rules) + "\n")

    def _iptables_chain(
        self, a: _Applier, direction: str, d: DirectionProfile | None, stat_loss: float
    ) -> None:
        chain = f"zw-dl-{a.s.tag[3:9]}-{direction}"
        ipt = ["iptables", "-t", "mangle"]
        new_mangle = shutil.which("nft") is not None and run(
            a.netns, ["nft", "list", "table", "ip", "mangle"], check=False).returncode != 0
        run(a.netns, [*ipt, "-N", chain])
        if new_mangle:
            a.created("nft-table", "ip mangle")  # iptables-nft created it just now
        a.created("iptables-chain", f"mangle {chain}")
        if stat_loss:
            run(a.netns, [*ipt, "-A", chain, "-m", "statistic", "--mode", "random",
                          "--probability", f"{stat_loss / 100:.6f}", "-j", "DROP"])
        if d is not None:
            queue = self._start_delay_line(a, chain, d)
            run(a.netns, [*ipt, "-A", chain, "-j", "NFQUEUE", "--queue-num", str(queue)])
        if direction == "up":
            run(a.netns, [*ipt, "-A", "POSTROUTING", "-o", a.s.ifname, "-j", chain])
        else:
            run(a.netns, [*ipt, "-A", "PREROUTING", "-i", a.s.ifname, "-j", chain])

    @staticmethod
    def _start_delay_line(a: _Applier, tag: str, d: DirectionProfile) -> int:
        first_queue = 1000 + (int(a.s.tag[3:9], 16) % 30000) * 2
        argv = ns_argv(a.netns, [
            sys.executable, "-m", DELAYLINE_MODULE, "--queue", str(first_queue),
            "--delay-ms", str(d.delay_ms), "--jitter-ms", str(d.jitter_ms),
            "--reorder-pct", str(d.reorder_pct), "--tag", tag,
            *(["--log", str(a.s.log_dir / f"{tag}.log")] if a.s.log_dir else []),
        ])
        env = dict(os.environ)
        pkg_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, text=True, env=env,
                                start_new_session=True)
        reap_on_exit(proc.pid)  # should the harness die without stopping it
        name = f"{proc.pid} {tag}"
        a.s._procs[name] = proc
        a.created("process", name)
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], _READY_TIMEOUT_S)
        line = proc.stdout.readline().strip() if ready else ""
        if not line.startswith("READY "):
            proc.kill()
            rest = proc.stdout.read() if proc.poll() is not None else ""
            raise ShapingError(f"delay line for {tag} did not start: {line} {rest}".strip())
        proc.stdout.close()
        return int(line.split()[1])
