"""The ``netem`` shaping backend: the kernel's netem qdisc (``tc-netem(8)``) via pyroute2.

``up`` becomes the interface's root qdisc, ``down`` a root qdisc on an IFB device fed by the
interface's ingress; a rate goes into a ``tbf`` child of the netem qdisc. It honours every field
of a :class:`~netem.LinkProfile`. Registered in :data:`netem._shaping.BACKENDS` as ``netem``.
"""

from __future__ import annotations

from typing import Any

from netem._nsexec import ipr
from netem._probe import KernelFeatures
from netem._profiles import DirectionProfile, LinkProfile
from netem._resources import ROOT_HANDLE
from netem._shaping import BACKENDS, _Applier, tbf_options


@BACKENDS.register
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
                      **tbf_options(d.rate_kbit))

    def apply(self, profile: LinkProfile, a: _Applier) -> None:
        if not profile.up.is_empty:
            self._netem(a, a.s.ifname, profile.up)
        if not profile.down.is_empty:
            ifb, _ = a.ingress_ifb()
            self._netem(a, ifb, profile.down)
