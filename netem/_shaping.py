"""Applying a :class:`~netem.LinkProfile` to an interface, through a backend chosen by ``kind``.

``apply_profile(profile, netns=..., ifname=...)`` shapes the link whose *client-side* end is
``ifname`` (in namespace ``netns``): ``profile.up`` on the interface's egress, ``profile.down``
on its ingress (through an IFB device). It returns an :class:`AppliedShaping` whose
``release()`` removes everything it created.

Backends (registered in :data:`BACKENDS` by ``kind``):

* ``netem``: the kernel's netem qdisc (``tc-netem(8)``) via pyroute2, with a ``tbf`` child for
  the rate; honours every field.
* ``fallback``: for kernels without netem. Rate: ``tbf``; loss: an nftables ``numgen random``
  drop rule in table ``inet zw-shape-*`` (or the iptables ``statistic`` match when nft is
  missing); delay, jitter and reorder: a userspace delay line (:mod:`netem._delayline`, NFQUEUE)
  on arriving packets, carrying both directions' delay (see :class:`FallbackBackend` for why).
  ``duplicate_pct``, ``corrupt_pct`` and ``up.reorder_pct`` are not available.

``backend="auto"`` picks ``netem`` where the kernel has it, else ``fallback``; the choice and the
reason are in ``AppliedShaping.backend``/``.reason``. A profile the chosen backend cannot honour
raises :class:`ShapingUnsupported` before anything is created, naming the missing kernel feature.
"""

from __future__ import annotations

import hashlib
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyroute2.netlink.exceptions import NetlinkError

from netem._errors import ShapingError, ShapingUnsupported
from netem._nsexec import NetnsError, ipr, ns_argv, run
from netem._probe import KCONFIG, KernelFeatures, probe_kernel
from netem._profiles import DirectionProfile, LinkProfile
from netem._resources import (
    DELAYLINE_MODULE,
    INGRESS_HANDLE,
    ROOT_HANDLE,
    kill_delay_line,
    remove_resource,
)

OnCreate = Callable[[str, str, "str | None"], None]

# tbf queue: this much time at the link rate (s), and never fewer than 10 full frames. Mobile
# links buffer deeply, so a bulk flow fills the queue and the RTT rises, as on a real link.
TBF_QUEUE_S = 0.2
_FRAME = 1514
_READY_TIMEOUT_S = 15.0


@dataclass
class AppliedShaping:
    """A profile in force on one interface.

    ``created`` lists ``(kind, name)`` of each resource in creation order (see
    :mod:`netem._resources` for the kinds; ``resources`` adds each one's namespace, which is the
    peer's for what went on the peer interface); ``release()`` removes them in reverse order, is
    idempotent, and returns the errors it met (empty when everything went).
    """

    backend: str
    reason: str
    profile: LinkProfile
    netns: str | None
    ifname: str
    tag: str
    created: list[tuple[str, str]] = field(default_factory=list)
    log_dir: Path | None = None
    peer: tuple[str | None, str] | None = None
    _where: list[str | None] = field(default_factory=list, repr=False)
    _procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict, repr=False)
    _released: bool = field(default=False, repr=False)

    @property
    def resources(self) -> list[tuple[str, str, str | None]]:
        """``(kind, name, netns)`` of each resource, in creation order."""
        return [(k, n, w) for (k, n), w in zip(self.created, self._where, strict=True)]

    def alive(self) -> bool:
        """True while every delay-line process of this shaping is running."""
        return all(p.poll() is None for p in self._procs.values())

    def record(self) -> dict[str, Any]:
        """What a run stores in run.json: backend, reason, requested profile, resources."""
        return {
            "backend": self.backend,
            "reason": self.reason,
            "netns": self.netns,
            "ifname": self.ifname,
            "profile": self.profile.model_dump(),
            "peer": list(self.peer) if self.peer else None,
            "created": [list(c) for c in self.resources],
        }

    def release(self) -> list[str]:
        if self._released:
            return []
        errors: list[str] = []
        for kind, name, where in reversed(self.resources):
            try:
                if kind == "process":
                    pid_s, _, tag = name.partition(" ")
                    kill_delay_line(int(pid_s), tag)
                    proc = self._procs.get(name)
                    if proc is not None:
                        proc.wait(timeout=5)  # reap it
                else:
                    remove_resource(kind, name, where)
            except (NetnsError, NetlinkError, OSError, subprocess.TimeoutExpired) as e:
                errors.append(f"{kind} {name}: {e}")
        self._released = True
        return errors

    def __enter__(self) -> AppliedShaping:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class _Applier:
    """Creates resources for one AppliedShaping, recording each right after it exists."""

    def __init__(self, shaping: AppliedShaping, on_create: OnCreate | None,
                 features: KernelFeatures) -> None:
        self.s = shaping
        self.on_create = on_create
        self.features = features

    @property
    def netns(self) -> str | None:
        return self.s.netns

    def created(self, kind: str, name: str, where: str | None | bool = True) -> None:
        """Record a resource; ``where`` is its namespace (default: the shaping's own)."""
        netns = self.s.netns if where is True else where
        assert netns is None or isinstance(netns, str)
        self.s.created.append((kind, name))
        self.s._where.append(netns)
        if self.on_create is not None:
            self.on_create(kind, name, netns)

    def ifindex(self, ifname: str, netns: str | None | bool = True) -> int:
        ns = self.s.netns if netns is True else netns
        assert ns is None or isinstance(ns, str)
        with ipr(ns) as ip:
            idx = ip.link_lookup(ifname=ifname)
        if not idx:
            raise ShapingError(f"interface {ifname!r} not found in netns {ns or 'host'}")
        return int(idx[0])

    def root_qdisc(self, ifname: str, kind: str, where: str | None | bool = True,
                   **options: Any) -> None:
        ns = self.s.netns if where is True else where
        assert ns is None or isinstance(ns, str)
        idx = self.ifindex(ifname, ns)
        with ipr(ns) as ip:
            ip.tc("add", kind, idx, ROOT_HANDLE, **options)
        self.created("qdisc", f"{ifname} root", ns)

    def ingress_ifb(self, on_peer: bool = False) -> tuple[str, str | None]:
        """Redirect everything arriving on the interface (or on the peer interface) to a new
        IFB device; returns the IFB's name and namespace."""
        if on_peer:
            assert self.s.peer is not None
            ns, ifname = self.s.peer
            ifb = f"zw-ifbu-{self.s.tag[3:9]}"
        else:
            ns, ifname = self.s.netns, self.s.ifname
            ifb = f"zw-ifb-{self.s.tag[3:9]}"
        idx = self.ifindex(ifname, ns)
        with ipr(ns) as ip:
            ip.link("add", ifname=ifb, kind="ifb")
            self.created("link", ifb, ns)
            ifb_idx = ip.link_lookup(ifname=ifb)[0]
            ip.link("set", index=ifb_idx, state="up")
            ip.tc("add", "ingress", idx, INGRESS_HANDLE)
            self.created("qdisc", f"{ifname} ingress", ns)
            ip.tc("add-filter", "u32", idx, parent=INGRESS_HANDLE, protocol=0x0003, prio=10,
                  keys=["0x0/0x0+0"], target=ROOT_HANDLE,
                  action={"kind": "mirred", "direction": "egress", "action": "redirect",
                          "ifindex": ifb_idx})
        return ifb, ns


class Backend(Protocol):
    kind: str

    def missing(self, profile: LinkProfile, f: KernelFeatures, netns: str | None) -> list[str]:
        """What this backend lacks here to honour ``profile`` (empty: it can)."""

    def apply(self, profile: LinkProfile, a: _Applier) -> None: ...


def _tbf_options(rate_kbit: float) -> dict[str, Any]:
    rate_bytes = rate_kbit * 1000 / 8
    burst = max(int(rate_bytes / 100), 2 * _FRAME)  # 10 ms at rate, at least two frames
    limit = max(int(rate_bytes * TBF_QUEUE_S), 10 * _FRAME) + burst
    return {"rate": f"{int(rate_kbit * 1000)}bit", "burst": burst, "limit": limit}


class NetemBackend:
    """The kernel netem qdisc: ``up`` as the interface's root qdisc, ``down`` on an IFB."""

    kind = "netem"

    def missing(self, profile: LinkProfile, f: KernelFeatures, netns: str | None) -> list[str]:
        need = ["netem"] if not profile.is_empty else []
        if not profile.down.is_empty:
            need += ["ifb", "ingress", "u32_mirred"]
        return f.missing(*need)

    @staticmethod
    def options(d: DirectionProfile) -> dict[str, Any]:
        """netem qdisc options (pyroute2 ``sched_netem``) for ``d``, without the rate.

        The rate goes into a ``tbf`` child of the netem qdisc instead (``tc-netem(8)``'s
        "netem + tbf" recipe): pyroute2 leaves a ``rate`` keyword also in the request's
        top-level attributes, where the kernel reads it as a rate estimator (TCA_RATE) and
        refuses the request with ERANGE (seen on this kernel).
        """
        o: dict[str, Any] = {
            "delay": int(d.delay_ms * 1000),  # us
            "jitter": int(d.jitter_ms * 1000),
            "loss": d.loss_pct,
            "duplicate": d.duplicate_pct,
            "limit": 10_000,
        }
        if d.reorder_pct:
            o["prob_reorder"] = d.reorder_pct
        if d.corrupt_pct:
            o["prob_corrupt"] = d.corrupt_pct
        return o

    def _netem(self, a: _Applier, ifname: str, d: DirectionProfile) -> None:
        a.root_qdisc(ifname, "netem", **self.options(d))
        if d.rate_kbit:
            idx = a.ifindex(ifname)
            with ipr(a.netns) as ip:  # child of netem's class 1:1, removed with the root
                ip.tc("add", "tbf", idx, 0xA0000, parent=ROOT_HANDLE + 1,
                      **_tbf_options(d.rate_kbit))

    def apply(self, profile: LinkProfile, a: _Applier) -> None:
        if not profile.up.is_empty:
            self._netem(a, a.s.ifname, profile.up)
        if not profile.down.is_empty:
            ifb, _ = a.ingress_ifb()
            self._netem(a, ifb, profile.down)


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
            a.root_qdisc(ifb_u, "tbf", ns_u, **_tbf_options(up.rate_kbit))
        elif up.rate_kbit:
            a.root_qdisc(ifname, "tbf", **_tbf_options(up.rate_kbit))
        if down.rate_kbit:
            ifb, _ = a.ingress_ifb()
            a.root_qdisc(ifb, "tbf", **_tbf_options(down.rate_kbit))
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


BACKENDS: dict[str, Backend] = {"netem": NetemBackend(), "fallback": FallbackBackend()}


def select_backend(
    profile: LinkProfile, netns: str | None, backend: str = "auto",
    features: KernelFeatures | None = None,
) -> tuple[Backend, str]:
    """The backend to use and why; raises :class:`ShapingUnsupported` (nothing is applied)."""
    f = features or probe_kernel()
    if backend != "auto":
        if backend not in BACKENDS:
            raise ShapingUnsupported(
                f"unknown shaping backend {backend!r}; kinds: auto, {', '.join(BACKENDS)}"
            )
        b = BACKENDS[backend]
        missing = b.missing(profile, f, netns)
        if missing:
            raise ShapingUnsupported(
                f"backend {backend!r} (forced) cannot apply profile "
                f"{profile.name or '(custom)'} on this kernel ({f.kernel}): missing "
                + "; ".join(missing)
            )
        return b, f"forced by the caller (backend={backend!r})"
    if f.netem:
        b = BACKENDS["netem"]
        missing = b.missing(profile, f, netns)
        if not missing:
            return b, "auto: the kernel has the netem qdisc"
    b = BACKENDS["fallback"]
    missing = b.missing(profile, f, netns)
    if missing:
        raise ShapingUnsupported(
            f"profile {profile.name or '(custom)'} cannot be applied on this kernel "
            f"({f.kernel}): missing " + "; ".join(missing)
        )
    return b, (
        "auto: the kernel has no netem qdisc (tc: 'Specified qdisc kind is unknown'); "
        "fallback = tbf rate, nftables loss, NFQUEUE delay line on arriving packets"
    )


def shaping_tag(netns: str | None, ifname: str) -> str:
    """The ``zw-xxxxxx`` tag naming a shaping's resources, stable per (netns, ifname)."""
    return "zw-" + hashlib.sha1(f"{netns}|{ifname}".encode()).hexdigest()[:6]


def apply_profile(
    profile: LinkProfile,
    *,
    netns: str | None,
    ifname: str,
    backend: str = "auto",
    on_create: OnCreate | None = None,
    log_dir: Path | None = None,
    features: KernelFeatures | None = None,
    peer: tuple[str | None, str] | None = None,
) -> AppliedShaping:
    """Shape the link whose client-side interface is ``ifname`` in ``netns`` (None: host).

    ``ifname`` must be one of the toolkit's own interfaces (named ``zw-*``), else
    :class:`ShapingError`: nothing the toolkit did not create is ever changed.

    ``profile.up`` goes on the interface's egress and ``profile.down`` on its ingress. ``backend``
    is ``"auto"``, ``"netem"`` or ``"fallback"``. ``on_create(kind, name, netns)`` is called right
    after each resource exists (for a state file). A delay line writes its messages after start-up
    to ``log_dir/<tag>.log`` when ``log_dir`` is given (e.g. the run folder). Raises
    :class:`ShapingUnsupported` before anything is created when the profile cannot be honoured,
    and :class:`ShapingError` when applying fails (what was created is removed again first).
    ``peer=(netns, ifname)`` names the other end of the link (the server-side veth end). With it,
    the fallback backend shapes ``up`` where its packets *arrive*, on the peer (an IFB with tbf,
    an nftables drop in table ``inet zw-shape-*`` of the peer's namespace), so the client's TCP
    sees neither a local drop nor TCP Small Queues holding its segments at the limiter (without
    a peer, the ``up`` rate is a tbf in the client's own stack: its TSQ then keeps ~2 skbs in
    it, and a late TSQ tasklet on a busy machine lets the link idle; measured once: 605 kbit/s
    of 1000). The peer interface must be named ``zw-*`` too.
    ``features`` replaces the probed :class:`~netem.KernelFeatures` (a caller that probed already,
    or a test that hides a feature to exercise the alternative path).
    """
    for name in (ifname, *([peer[1]] if peer else [])):
        if not name.startswith("zw-"):
            raise ShapingError(
                f"refusing to shape interface {name!r}: the toolkit only changes interfaces it "
                "created, and those are named zw-*"
            )
    f = features or probe_kernel()
    b, reason = select_backend(profile, netns, backend, f)
    shaping = AppliedShaping(backend=b.kind, reason=reason, profile=profile, netns=netns,
                             ifname=ifname, tag=shaping_tag(netns, ifname), log_dir=log_dir,
                             peer=peer)
    if profile.is_empty:
        shaping.reason += "; profile is empty, nothing applied"
        return shaping
    try:
        b.apply(profile, _Applier(shaping, on_create, f))
    except BaseException as e:
        errors = shaping.release()
        extra = f" (and clean-up failed: {'; '.join(errors)})" if errors else ""
        if isinstance(e, ShapingError):
            raise ShapingError(f"{e}{extra}") from e
        if isinstance(e, (NetnsError, NetlinkError, OSError)):
            raise ShapingError(
                f"applying {profile.name or 'profile'} to {ifname} in "
                f"{netns or 'host'} with backend {b.kind} failed: {e}{extra}"
            ) from e
        raise
    return shaping
