"""What the run needs of a server (a target or a proxy), and the registries of their kinds.

A kind is one module of this package: a config model registered with :data:`TARGETS` or
:data:`PROXIES` (its ``kind`` default names it) whose :meth:`build` returns the server object.
The scenario's ``target`` and ``proxy`` fields validate against these registries
(:data:`TargetConfig`, :data:`ProxyConfig`), so a new kind needs no other change (see
``docs/extending.md``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel, ConfigDict

from harness._engine_probe import STATUS_FILE, read_status
from harness.runfolder import PROBE_COLUMNS, hop_metric_name
from harness.servers._metric_names import (
    EXTRA_PRESETS,
    HISTOGRAM_FIGURES,
    SCALAR_FIGURES,
    MetricNames,
    read_figures,
)
from harness.servers._process import ServerProcess
from harness.servers._proxy_metrics import ProxyFigure, read_proxy_figures
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
    model name requests carry, ``config`` the options it was built from (its kind: what the
    kind declares there, :class:`TargetConfigBase`, holds for it)."""

    config: TargetConfigBase
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

    def metric_names(self) -> tuple[MetricNames, ...]:
        """The names its ``/metrics`` is read by: its kind's (``config.metric_names``; none
        when the kind declares none)."""
        names = self.config.metric_names
        return () if names is None else (names,)

    def read_metrics(self, text: str) -> dict[str, float]:
        """The figures of a ``/metrics`` answer of this target, by :meth:`metric_names`
        (:func:`~harness.servers._metric_names.read_figures`). Raises ``ValueError`` for text
        that is not a Prometheus exposition."""
        return read_figures(text, self.metric_names())

    def expected_figures(self) -> list[str]:
        """The figures a run looks for in every target's ``/metrics`` (``kv_cache_usage``...,
        ``<histogram>_count``): one the target never gave is reported missing."""
        return [*SCALAR_FIGURES, *(f"{h}_count" for h in HISTOGRAM_FIGURES)]

    def versions(self) -> dict[str, str | None]:
        """Versions of the engine this target runs, by package or program name, for
        ``run.json``'s ``versions`` beside the toolkit's (``None``: not found). Default: none
        known (a server the run does not start)."""
        return {}

    def idle(self, client: httpx.Client) -> bool | None:
        """Whether the engine has no request running and none waiting, by one ``GET
        {base_url}/metrics`` read with its own names through ``client``; ``None`` when it
        reports no running gauge (nothing to wait for). Raises ``httpx.HTTPError`` when
        ``/metrics`` does not answer 2xx, ``ValueError`` when the answer is no exposition."""
        response = client.get(f"{self.base_url}/metrics")
        response.raise_for_status()
        figures = self.read_metrics(response.text)
        if "num_requests_running" not in figures:
            return None
        return figures["num_requests_running"] + figures.get("num_requests_waiting", 0.0) == 0

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


def url_port(url: str) -> int:
    """The port of ``url`` (80 or 443 by its scheme when it names none)."""
    parts = urlsplit(url)
    return parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True)
class ProxyHop:
    """One proxy on the path from the clients to the target, as the run probes it
    (``harness.collectors.ProxyProbe``): ``index`` (0 faces the clients; a single proxy is hop
    0), ``kind``, ``pid`` (its main process; ``None``: it has none), ``listen_port`` (where the
    hop in front of it, or the clients, connect), ``upstream_port`` (the next hop's port, the
    target's for the last), ``metrics_url`` (its own Prometheus metrics, ``None``: it serves
    none), ``spill_dir`` (where it spills buffered response bytes to files, ``None``: it does
    not) and ``figures`` (what its metrics are read by)."""

    index: int
    kind: str
    pid: int | None
    listen_port: int
    upstream_port: int
    metrics_url: str | None = None
    spill_dir: Path | None = None
    figures: tuple[ProxyFigure, ...] = ()

    def read_metrics(self, text: str) -> dict[str, float]:
        """The hop's figures from a ``metrics_url`` answer
        (:func:`~harness.servers._proxy_metrics.read_proxy_figures`). Raises ``ValueError`` for
        text that is not a Prometheus exposition."""
        return read_proxy_figures(text, self.figures)

    def describe(self) -> dict[str, Any]:
        """The hop for ``run.json``'s ``proxy_hops``: ``index``, ``kind``, ``port`` (its listening
        port), ``upstream_port``, ``pid``, ``metrics_url``, ``spill_dir`` and
        ``metric_figures`` (each :meth:`ProxyFigure.describe`), which the analysis reads."""
        return {
            "index": self.index, "kind": self.kind, "port": self.listen_port,
            "upstream_port": self.upstream_port, "pid": self.pid, "metrics_url": self.metrics_url,
            "spill_dir": None if self.spill_dir is None else str(self.spill_dir),
            "metric_figures": [f.describe() for f in self.figures],
        }  # fmt: skip


class Proxy(Server):
    """What stands between the clients and the target. ``metrics_url``: its own Prometheus
    metrics, if it serves any, read by :attr:`metric_figures`."""

    metrics_url: str | None = None
    metric_figures: ClassVar[tuple[ProxyFigure, ...]] = ()
    """The figures this kind serves at its ``metrics_url`` and the Prometheus names it serves
    them under (``()``: none); each hop's are read by them and summarized per hop
    (``summary.json`` ``proxy.hops[].metrics``)."""

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Start in front of ``upstream_url``; return the URL clients use. Raises
        :class:`~zwcore.ProxyError`."""
        raise NotImplementedError

    def spill_dir(self, run_dir: Path) -> Path | None:
        """Where the proxy spills buffered response bytes to files (``None``: it does not)."""
        return None

    def probe_hops(self, run_dir: Path, client_url: str, upstream_url: str) -> list[ProxyHop]:
        """What the run probes of this proxy once started in ``run_dir`` (``client_url``: the
        URL :meth:`start` returned; ``upstream_url``: the one it was given): one
        :class:`ProxyHop` per proxy process on the path, the clients' side first. Default:
        this proxy, hop 0."""
        return [
            ProxyHop(
                index=0, kind=self.kind, pid=self.pid(), listen_port=url_port(client_url),
                upstream_port=url_port(upstream_url), metrics_url=self.metrics_url,
                spill_dir=self.spill_dir(run_dir), figures=self.metric_figures,
            )
        ]  # fmt: skip


def hop_metric_names(kind: str) -> list[str]:
    """The names the own metrics of a proxy hop of ``kind`` take in a run's summary
    (:func:`harness.runfolder.hop_metric_name` of its :attr:`Proxy.metric_figures`, but those
    that feed the probe's own columns, :data:`harness.runfolder.PROBE_COLUMNS`; a ``by_label``
    figure's per-value names are not known before the run), for the proxy kinds loaded;
    ``[]`` for a kind without metrics."""
    classes: list[type[Proxy]] = [Proxy]
    while classes:
        cls = classes.pop()
        if cls.__dict__.get("kind") == kind and cls.metric_figures:
            figures = [f for f in cls.metric_figures if f.figure not in PROBE_COLUMNS]
            return sorted({hop_metric_name(f.figure, f.type) for f in figures})
        classes += cls.__subclasses__()
    return []


class TargetConfigBase(StrictOptions):
    """Options of a target kind, and what the kind declares. Subclasses define
    ``kind: Literal["name"] = "name"``, ``served_model_name`` and :meth:`build`, and declare
    :attr:`metric_names` and :attr:`writes_tables`; the target :meth:`build` returns holds the
    rest of the kind's facts (:meth:`Target.versions`, :meth:`Target.idle`)."""

    kind: str
    served_model_name: str
    metric_names: ClassVar[MetricNames | None] = None
    """The Prometheus names this kind's server serves its figures under (``None``: it serves
    none); the run reads the target's ``/metrics`` by them, and a ``url`` target by those of
    every registered kind (:func:`known_metric_names`)."""
    writes_tables: ClassVar[bool] = False
    """Whether this kind's engine writes the engine tables (``engine_steps.parquet``,
    ``engine_requests.parquet``, ``engine_probe.json``) into ``$ZEROWINDOW_ENGINE_DIR`` (the
    emulator, vLLM with the engine probe, llama-cpp-python's probe wrapper)."""

    def build(self) -> Target:
        """The target these options describe (not started)."""
        raise NotImplementedError

    @classmethod
    def for_suite(cls, *, model: str | None) -> TargetConfigBase | None:
        """The target ``zerowindow suite run --target KIND`` runs an incident against when the
        incident's own target is of another kind (``model``: the ``--model`` given, ``None``
        without one), or ``None`` when this kind cannot stand in for an incident's target (it
        needs options of its own). Raises :class:`~zwcore.ScenarioError` for a ``model`` the
        kind has no use for."""
        return None


class ProxyConfigBase(StrictOptions):
    """Options of a proxy kind. Subclasses define ``kind: Literal["name"] = "name"`` and
    :meth:`build`, and a kind the proxy benchmark can measure, :meth:`for_bench`."""

    kind: str

    def build(self) -> Proxy:
        """The proxy these options describe (not started)."""
        raise NotImplementedError

    def hop_kinds(self) -> list[str]:
        """The kinds of the proxies these options put between the clients and the target, the
        clients' side first (a run's ``proxy.hop<i>`` figures): this kind."""
        return [self.kind]

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """The configurations ``zerowindow bench proxy`` measures this kind in, by the name its
        table gives each (a kind may give several, e.g. ``haproxy`` and ``haproxy-nodelay``):
        the kind's defaults but for a kernel send buffer toward clients of
        ``client_sndbuf_bytes`` bytes and a write-stall cut of about 3 s where the kind has
        one. ``{}`` (the default): the kind is not benchmarkable."""
        return {}


TARGETS: Registry[TargetConfigBase] = Registry("target")
"""Target config models by ``kind``."""
PROXIES: Registry[ProxyConfigBase] = Registry("proxy")
"""Proxy config models by ``kind``."""

TargetConfig = Annotated[TargetConfigBase, TARGETS.validator, TARGETS.serializer]
"""A scenario field holding any registered target config, chosen by its ``kind``."""
ProxyConfig = Annotated[ProxyConfigBase, PROXIES.validator, PROXIES.serializer]
"""A scenario field holding any registered proxy config, chosen by its ``kind``."""


def metric_presets() -> dict[str, MetricNames]:
    """Metric names by preset name: every registered target kind's own (by its kind: ``vllm``,
    ``sim``, ``llama-server``..., a plugin's kind from when it is registered), then those of
    engines without a kind (:data:`~harness.servers._metric_names.EXTRA_PRESETS`: ``sglang``).
    What a ``command`` target's ``metrics = "NAME"`` picks."""
    out = {k: m for k in TARGETS.kinds() if (m := TARGETS.get(k).metric_names) is not None}
    return {**out, **EXTRA_PRESETS}


def known_metric_names() -> tuple[MetricNames, ...]:
    """Every preset's metric names (:func:`metric_presets`), each once, registered kinds first:
    how a server of unknown kind (a ``url`` target) is read."""
    out: list[MetricNames] = []
    for names in metric_presets().values():
        if names not in out:
            out.append(names)
    return tuple(out)


def make_target(config: TargetConfigBase) -> Target:
    """The target for ``config``. Raises :class:`~zwcore.UnknownKindError` naming the valid
    kinds."""
    return TARGETS.parse(config).build()


def make_proxy(config: ProxyConfigBase) -> Proxy:
    """The proxy for ``config``. Raises :class:`~zwcore.UnknownKindError` naming the valid
    kinds."""
    return PROXIES.parse(config).build()
