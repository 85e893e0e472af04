"""Manual shaping outside a run: ``zerowindow netem apply/show/clear``.

Only interfaces whose name starts with ``zw-`` (the toolkit's own: a run's veth ends, or ones
a user created under that prefix for experiments) can be shaped or cleared: the toolkit never
changes an interface it did not create.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from pyroute2 import IPRoute

from netem._netns import PREFIX, NetemError, list_netns, require_net_admin
from netem._nsexec import ipr
from netem._profiles import LinkProfile
from netem._resources import leftovers, remove_resource
from netem._shaping import AppliedShaping, ShapingError, apply_profile, shaping_tag
from netem._show import ShapingState, show
from netem._state import RUNTIME_DIR, owner_alive, read_state


def _own_interface(netns: str | None, ifname: str) -> None:
    if not ifname.startswith(PREFIX):
        raise NetemError(
            f"interface {ifname} was not created by zerowindow (its name lacks the {PREFIX!r} "
            "prefix); the toolkit never changes interfaces it did not create"
        )
    if netns is not None and netns not in list_netns():
        raise NetemError(f"network namespace {netns} does not exist")
    with ipr(netns) as ip:
        if not ip.link_lookup(ifname=ifname):
            raise NetemError(f"interface {ifname} not found in {netns or 'the host namespace'}")


def apply_and_hold(
    profile: LinkProfile,
    *,
    netns: str | None,
    ifname: str,
    backend: str = "auto",
    on_applied: Callable[[AppliedShaping], None] | None = None,
    stop: threading.Event | None = None,
) -> list[str]:
    """Apply ``profile`` to ``ifname`` in ``netns`` and keep it until SIGINT/SIGTERM (or
    ``stop`` is set), then release it; returns the release errors. ``on_applied`` is called
    once the shaping is in force. The fallback backend's delay line lives as long as this
    process, hence the holding. Raises :class:`NetemError` for a foreign or missing interface,
    a missing capability, or a profile no backend can honour."""
    require_net_admin("shaping a link")
    _own_interface(netns, ifname)
    stop = stop or threading.Event()
    previous = {
        s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)
    }
    try:
        try:
            applied = apply_profile(profile, netns=netns, ifname=ifname, backend=backend)
        except ShapingError as exc:
            raise NetemError(str(exc)) from None
        try:
            if on_applied is not None:
                on_applied(applied)
            while not stop.wait(0.5):
                if not applied.alive():
                    break
        finally:
            errors = applied.release()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return errors


def clear_shaping(*, netns: str | None, ifname: str) -> list[str]:
    """Remove the shaping the toolkit put on ``ifname`` in ``netns`` (qdiscs, its IFB device,
    its nftables table and iptables chain, its delay line); returns what was removed."""
    require_net_admin("clearing a link's shaping")
    _own_interface(netns, ifname)
    tag = shaping_tag(netns, ifname)[3:]
    removed = []
    for kind, name, ns in leftovers(PREFIX, namespaces=[netns]):
        mine = name.startswith(f"{ifname} ") or tag in name
        if ns == netns and mine and remove_resource(kind, name, ns):
            removed.append(f"{kind} {name}")
    return removed


def overview() -> dict[str, Any]:
    """The toolkit's namespaces and interfaces and the shaping on each interface, and the runs
    that hold resources now: ``{"runs": [...], "namespaces": {ns: {ifname: ShapingState}}}``
    (``None`` is the host namespace, where only ``zw-`` interfaces are listed)."""
    runs = []
    if RUNTIME_DIR.is_dir():
        for path in sorted(RUNTIME_DIR.glob("*.json")):
            state = read_state(path)
            if state is not None:
                runs.append(
                    {
                        "run_id": state["run_id"],
                        "run_dir": state.get("run_dir"),
                        "alive": owner_alive(state),
                        "resources": len(state.get("resources", [])),
                    }
                )
    spaces: dict[str | None, dict[str, ShapingState]] = {}
    for netns in [None, *[n for n in list_netns() if n.startswith(PREFIX)]]:
        try:
            with ipr(netns) if netns else IPRoute() as ip:
                names = [link.get("ifname") or "" for link in ip.get_links()]
        except Exception:
            continue  # vanished meanwhile
        names = [n for n in names if n.startswith(PREFIX) and not n.startswith(f"{PREFIX}ifb-")]
        spaces[netns] = {n: show(netns, n) for n in names}
    return {"runs": runs, "namespaces": spaces}
