"""What the run needs of a server (a target or a proxy), and the registries of their kinds.

A kind is one module of this package: a config model registered with :data:`TARGETS` or
:data:`PROXIES` (its ``kind`` default names it) whose :meth:`build` returns the server object.
The scenario's ``target`` and ``proxy`` fields validate against these registries
(:data:`TargetConfig`, :data:`ProxyConfig`), so a new kind needs no other change (see
``docs/extending.md``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from harness._engine_probe import STATUS_FILE, read_status
from harness.servers._process import ServerProcess
from zwcore import Registry


class StrictOptions(BaseModel):
    """Frozen options that reject unknown fields (a typo in a scenario is an error)."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class Server:
    """What targets and proxies share: the processes the run starts for them (placed in the
    server's network namespace when the run has one), their health, clean-up and facts."""

    kind: ClassVar[str]

    def processes(self) -> list[ServerProcess]:
        """The processes this server starts (none for a server the run does not start)."""
        return []

    def failure(self) -> str | None:
        """``None`` while the server is alive, else why it is not."""
        for process in self.processes():
            if reason := process.failure():
                return reason
        return None

    def stop(self) -> None:
        """Release everything ``start`` created. Safe to call more than once."""
        for process in self.processes():
            process.stop(grace_s=5.0)

    def pid(self) -> int | None:
        """The pid of the server's main process, once started (``None``: no process, as for a
        server the run does not start); the run samples a target's threads and RSS and a
        proxy's memory by it."""
        procs = [p.proc for p in self.processes() if p.proc is not None]
        return int(procs[0].pid) if procs else None

    def describe(self) -> dict[str, Any]:
        """Facts for ``run.json``: kind, command line, versions."""
        return {"kind": self.kind}


class Target(Server):
    """The server under test. ``base_url`` is where it answers, ``served_model_name`` the
    model name requests carry."""

    base_url: str
    served_model_name: str
    engine_dir: Path | None = None
    """Where the engine writes its own tables (``harness._engine_probe``), once started;
    ``None`` when it writes none."""
    probe_note: str | None = None
    """Why the engine writes no tables, when it writes none."""
    serves_slots: ClassVar[bool] = False
    """Whether the engine answers ``GET /slots`` (llama-server), which the run then samples."""

    def start(self, run_dir: Path) -> None:
        """Start (or reach) the server; return when it is ready. Raises
        :class:`~zwcore.TargetError`."""
        raise NotImplementedError

    def engine_probe(self) -> dict[str, Any]:
        """``run.json``'s ``engine_probe``: the engine's ``engine_probe.json`` in
        ``engine_dir`` (``failed`` when it wrote none there), else ``not_run`` with
        ``probe_note`` (default: a target the run does not start cannot have a probe loaded
        into it, so its verdicts come from scrapes only)."""
        if self.engine_dir is None:
            reason = self.probe_note or (
                f"a {self.kind} target: the run does not start the engine, so it cannot load a "
                "probe into it; verdicts come from /metrics scrapes only"
            )
            return {"status": "not_run", "reason": reason}
        status = read_status(self.engine_dir)
        return status or {
            "status": "failed",
            "reason": f"the engine wrote no {STATUS_FILE} in {self.engine_dir}",
        }


class Proxy(Server):
    """What stands between the clients and the target. ``metrics_url``: its own Prometheus
    metrics, if it serves any."""

    metrics_url: str | None = None

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Start in front of ``upstream_url``; return the URL clients use. Raises
        :class:`~zwcore.ProxyError`."""
        raise NotImplementedError

    def spill_dir(self, run_dir: Path) -> Path | None:
        """Where the proxy spills buffered response bytes to files (``None``: it does not)."""
        return None


class TargetConfigBase(StrictOptions):
    """Options of a target kind. Subclasses define ``kind: Literal["name"] = "name"`` and
    ``served_model_name``, and :meth:`build`."""

    kind: str
    served_model_name: str

    def build(self) -> Target:
        """The target these options describe (not started)."""
        raise NotImplementedError

    @classmethod
    def for_suite(cls, *, model: str) -> TargetConfigBase | None:
        """The target ``zerowindow suite run --target KIND`` runs an incident against when the
        incident's own target is of another kind (``model``: the ``--model`` given), or
        ``None`` when this kind cannot stand in for an incident's target (it needs options of
        its own)."""
        return None


class ProxyConfigBase(StrictOptions):
    """Options of a proxy kind. Subclasses define ``kind: Literal["name"] = "name"`` and
    :meth:`build`."""

    kind: str

    def build(self) -> Proxy:
        """The proxy these options describe (not started)."""
        raise NotImplementedError


TARGETS: Registry[TargetConfigBase] = Registry("target")
"""Target config models by ``kind``."""
PROXIES: Registry[ProxyConfigBase] = Registry("proxy")
"""Proxy config models by ``kind``."""

TargetConfig = Annotated[TargetConfigBase, TARGETS.validator, TARGETS.serializer]
"""A scenario field holding any registered target config, chosen by its ``kind``."""
ProxyConfig = Annotated[ProxyConfigBase, PROXIES.validator, PROXIES.serializer]
"""A scenario field holding any registered proxy config, chosen by its ``kind``."""


def make_target(config: TargetConfigBase) -> Target:
    """The target for ``config``. Raises :class:`~zwcore.UnknownKindError` naming the valid
    kinds."""
    return TARGETS.parse(config).build()


def make_proxy(config: ProxyConfigBase) -> Proxy:
    """The proxy for ``config``. Raises :class:`~zwcore.UnknownKindError` naming the valid
    kinds."""
    return PROXIES.parse(config).build()
