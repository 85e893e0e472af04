"""Applying a :class:`~netem.LinkProfile` to an interface, through a backend chosen by ``kind``.

``apply_profile(profile, netns=..., ifname=...)`` shapes the link whose *client-side* end is
``ifname`` (in namespace ``netns``): ``profile.up`` on the interface's egress, ``profile.down``
on its ingress (through an IFB device). It returns an :class:`AppliedShaping` whose
``release()`` removes everything it created.

Backends (registered in :data:`BACKENDS` by ``kind``):

* ``netem``: the kernel's netem qdisc (``tc-netem(8)``) via pyroute2; honours every field.
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


class ShapingError(RuntimeError):
    """Applying a profile failed; everything created so far has been removed again."""


class ShapingUnsupported(ShapingError):
    """No selected backend can honour the profile here; the message names what is missing."""


@dataclass
class AppliedShaping:
    """A profile in force on one interface.

    ``created`` lists ``(kind, name)`` of each resource in creation order (see
    :mod:`netem._resources` for the kinds); ``release()`` removes them in reverse order, is
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
    _procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict, repr=False)
    _released: bool = field(default=False, repr=False)

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
            "created": [list(c) for c in self.created],
        }

    def release(self) -> list[str]:
        if self._released:
            return []
        errors: list[str] = []
        for kind, name in reversed(self.created):
            try:
                if kind == "process":
                    pid_s, _, tag = name.partition(" ")
                    kill_delay_line(int(pid_s), tag)
                    proc = self._procs.get(name)
                    if proc is not None:
                        proc.wait(timeout=5)  # reap it
                else:
                    remove_resource(kind, name, self.netns)
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

    def created(self, kind: str, name: str) -> None:
        self.s.created.append((kind, name))
        if self.on_create is not None:
            self.on_create(kind, name, self.s.netns)

    def ifindex(self, ifname: str) -> int:
        with ipr(self.netns) as ip:
            idx = ip.link_lookup(ifname=ifname)
        if not idx:
            raise ShapingError(f"interface {ifname!r} not found in netns {self.netns or 'host'}")
        return int(idx[0])

    def root_qdisc(self, ifname: str, kind: str, **options: Any) -> None:
        idx = self.ifindex(ifname)
        with ipr(self.netns) as ip:
            ip.tc("add", kind, idx, ROOT_HANDLE, **options)
        self.created("qdisc", f"{ifname} root")

    def ingress_ifb(self) -> str:
        """Redirect everything arriving on the interface to a new IFB device; returns its name."""
        ifb = f"zw-ifb-{self.s.tag[3:9]}"
        idx = self.ifindex(self.s.ifname)
        with ipr(self.netns) as ip:
            ip.link("add", ifname=ifb, kind="ifb")
            self.created("link", ifb)
            ifb_idx = ip.link_lookup(ifname=ifb)[0]
            ip.link("set", index=ifb_idx, state="up")
            ip.tc("add", "ingress", idx, INGRESS_HANDLE)
            self.created("qdisc", f"{self.s.ifname} ingress")
            ip.tc("add-filter", "u32", idx, parent=INGRESS_HANDLE, protocol=0x0003, prio=10,
                  keys=["0x0/0x0+0"], target=ROOT_HANDLE,
                  action={"kind": "mirred", "direction": "egress", "action": "redirect",
                          "ifindex": ifb_idx})
        return ifb


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
        if d.rate_kbit:
            o["rate"] = f"{int(d.rate_kbit * 1000)}bit"
        return o

    def apply(self, profile: LinkProfile, a: _Applier) -> None:
        if not profile.up.is_empty:
            a.root_qdisc(a.s.ifname, "netem", **self.options(profile.up))
        if not profile.down.is_empty:
            ifb = a.ingress_ifb()
            a.root_qdisc(ifb, "netem", **self.options(profile.down))


class FallbackBackend:
    """tbf + nftables loss + NFQUEUE delay line, for kernels without netem (see module doc).

    Placement, and why:

    * Rate: ``tbf`` as the interface's root qdisc (``up``) and on an IFB device fed by the
      interface's ingress (``down``).
    * Loss: nftables ``numgen random`` drops in table ``inet zw-shape-*``, postrouting
      (``up``, ``oifname``) and prerouting (``down``, ``iifname``). An ``up`` drop happens inside
      the client's own stack, so a local TCP sender sees it as a failed transmit and retries
      (netem hides such drops from the sender); a UDP sender gets EPERM.
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
        if up.rate_kbit:
            a.root_qdisc(ifname, "tbf", **_tbf_options(up.rate_kbit))
        if down.rate_kbit:
            ifb = a.ingress_ifb()
            a.root_qdisc(ifb, "tbf", **_tbf_options(down.rate_kbit))
        if use_nft and (up.loss_pct or down.loss_pct):
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
    def _nft_loss(a: _Applier, up_pct: float, down_pct: float) -> None:
        table = f"zw-shape-{a.s.tag[3:9]}"
        rules = [f"table inet {table} {{"]
        # priority -300: before conntrack and the mangle table's NFQUEUE jump
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
) -> AppliedShaping:
    """Shape the link whose client-side interface is ``ifname`` in ``netns`` (None: host).

    ``profile.up`` goes on the interface's egress and ``profile.down`` on its ingress. ``backend``
    is ``"auto"``, ``"netem"`` or ``"fallback"``. ``on_create(kind, name, netns)`` is called right
    after each resource exists (for a state file). A delay line writes its messages after start-up
    to ``log_dir/<tag>.log`` when ``log_dir`` is given (e.g. the run folder). Raises
    :class:`ShapingUnsupported` before anything is created when the profile cannot be honoured,
    and :class:`ShapingError` when applying fails (what was created is removed again first).
    ``features`` replaces the probed :class:`~netem.KernelFeatures` (a caller that probed already,
    or a test that hides a feature to exercise the alternative path).
    """
    f = features or probe_kernel()
    b, reason = select_backend(profile, netns, backend, f)
    shaping = AppliedShaping(backend=b.kind, reason=reason, profile=profile, netns=netns,
                             ifname=ifname, tag=shaping_tag(netns, ifname), log_dir=log_dir)
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
