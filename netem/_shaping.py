"""Applying a :class:`~netem.LinkProfile` to an interface, through a backend chosen by ``kind``.

This module holds what every backend shares: the :class:`Backend` protocol, the registry
:data:`BACKENDS`, backend selection (:func:`select_backend`), :func:`apply_profile`, and the
record of a shaping in force (:class:`AppliedShaping`, with the :class:`_Applier` that backends
create resources through). The backends themselves live in their own modules.

``apply_profile(profile, netns=..., ifname=...)`` shapes the link whose *client-side* end is
``ifname`` (in namespace ``netns``): ``profile.up`` on the interface's egress, ``profile.down``
on its ingress (through an IFB device). It returns an :class:`AppliedShaping` whose
``release()`` removes everything it created.

Backends (registered in :data:`BACKENDS`, a :class:`zwcore.Registry`, by ``kind``):

* ``netem`` (:mod:`netem._shaping_netem`): the kernel's netem qdisc (``tc-netem(8)``) via
  pyroute2, with a ``tbf`` child for the rate; honours every field.
* ``fallback`` (:mod:`netem._shaping_fallback`): for kernels without netem. Rate: ``tbf``; loss:
  an nftables ``numgen random`` drop rule in table ``inet zw-shape-*`` (or the iptables
  ``statistic`` match when nft is missing); delay, jitter and reorder: a userspace delay line
  (:mod:`netem._delayline`, NFQUEUE) on arriving packets, carrying both directions' delay (see
  :class:`~netem._shaping_fallback.FallbackBackend` for why). ``duplicate_pct``,
  ``corrupt_pct`` and ``up.reorder_pct`` are not available.

A new backend is one module holding a class with a ``kind`` class attribute, ``missing()`` and
``apply()`` (see :class:`Backend`), decorated with ``@BACKENDS.register``, and its module added
to the import at the end of this one (importing a backend's module registers it).

``backend="auto"`` picks ``netem`` where the kernel has it, else ``fallback``; the choice and the
reason are in ``AppliedShaping.backend``/``.reason``. A profile the chosen backend cannot honour
raises :class:`ShapingUnsupported` before anything is created, naming the missing kernel feature.
"""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pyroute2.netlink.exceptions import NetlinkError

from netem._errors import ShapingError, ShapingUnsupported
from netem._nsexec import NetnsError, ipr
from netem._probe import KernelFeatures, probe_kernel
from netem._profiles import LinkProfile
from netem._resources import INGRESS_HANDLE, ROOT_HANDLE, kill_delay_line, remove_resource
from zwcore import Registry, UnknownKindError

OnCreate = Callable[[str, str, "str | None"], None]

# tbf queue: this much time at the link rate (s), and never fewer than 10 full frames. Mobile
# links buffer deeply, so a bulk flow fills the queue and the RTT rises, as on a real link.
TBF_QUEUE_S = 0.2
_FRAME = 1514


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
    """A shaping backend; registered in :data:`BACKENDS` under its ``kind`` class attribute
    and instantiated (without arguments) each time it is selected."""

    kind: str

    def missing(self, profile: LinkProfile, f: KernelFeatures, netns: str | None) -> list[str]:
        """What this backend lacks here to honour ``profile`` (empty: it can)."""

    def apply(self, profile: LinkProfile, a: _Applier) -> None: ...


def tbf_options(rate_kbit: float) -> dict[str, Any]:
    """tbf qdisc options for ``rate_kbit``: the rate, a 10 ms burst and a queue of
    :data:`TBF_QUEUE_S` at the rate."""
    rate_bytes = rate_kbit * 1000 / 8
    burst = max(int(rate_bytes / 100), 2 * _FRAME)  # 10 ms at rate, at least two frames
    limit = max(int(rate_bytes * TBF_QUEUE_S), 10 * _FRAME) + burst
    return {"rate": f"{int(rate_kbit * 1000)}bit", "burst": burst, "limit": limit}


BACKENDS: Registry[Backend] = Registry("shaping backend")


def select_backend(
    profile: LinkProfile, netns: str | None, backend: str = "auto",
    features: KernelFeatures | None = None,
) -> tuple[Backend, str]:
    """The backend to use and why; raises :class:`ShapingUnsupported` (nothing is applied)."""
    f = features or probe_kernel()
    if backend != "auto":
        try:
            b = BACKENDS.get(backend)()
        except UnknownKindError:
            raise ShapingUnsupported(
                f"unknown shaping backend {backend!r}; kinds: auto, {', '.join(BACKENDS.kinds())}"
            ) from None
        missing = b.missing(profile, f, netns)
        if missing:
            raise ShapingUnsupported(
                f"backend {backend!r} (forced) cannot apply profile "
                f"{profile.name or '(custom)'} on this kernel ({f.kernel}): missing "
                + "; ".join(missing)
            )
        return b, f"forced by the caller (backend={backend!r})"
    if f.netem:
        b = BACKENDS.get("netem")()
        missing = b.missing(profile, f, netns)
        if not missing:
            return b, "auto: the kernel has the netem qdisc"
    b = BACKENDS.get("fallback")()
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


# The built-in backends register themselves in BACKENDS when their modules are imported; they
# import the names above, hence last. A new backend is one more module on this line.
from netem import _shaping_fallback, _shaping_netem  # noqa: E402, F401
