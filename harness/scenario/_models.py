"""Scenario models: what an experiment runs, validated by pydantic.

A scenario names a target (the server under test), one or more user groups (each a Locust
process of identical users with one read behaviour), and collector and verdict settings. See
``scenarios/slow-readers.toml`` for a commented example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from harness.scenario._figure_check import GateField, check_figures
from harness.scenario._gate_syntax import Gate
from harness.scenario._matrix import MatrixConfig, expand_matrix
from harness.scenario._placement import PlacementConfig
from harness.servers import (
    PROXIES,
    NoProxyConfig,
    ProxyConfig,
    TargetConfig,
)
from loadgen import UserGroupConfig
from netem import BACKENDS
from zwcore import load_plugins


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CollectorConfig(_Strict):
    """Sampling intervals of the server-side collectors, in seconds."""

    metrics_interval_s: float = Field(0.25, gt=0)
    sockets_interval_s: float = Field(0.1, gt=0)


class VerdictConfig(_Strict):
    """Settings of the "KV held by undelivered streams" verdict.

    The engine is taken to have finished generating when it reports no running request, or, if
    ``generation_bound_s`` is set, that many seconds after the first request was sent,
    whichever comes first. ``min_observe_s`` is how long undelivered data must be seen in
    Send-Q after that for a "none held" answer to count.
    """

    generation_bound_s: float | None = Field(None, gt=0)
    min_observe_s: float = Field(1.0, gt=0)
    kv_held_min_ms: float = Field(
        100.0,
        gt=0,
        description="from the engine's own records: a request whose KV is freed more than "
        "this long after its last generated token, while its client still lacked output, "
        "held KV",
    )


class GatingConfig(_Strict):
    """How gates treat noise (``[gating]``; ``harness.gates._evaluate``).

    A relative gate compares the run's interval with the baseline's (each at ``confidence``,
    from ``bootstrap_draws`` draws: ``harness.analysis._uncertainty``): it passes when the
    bound holds across the interval, fails when it is broken across it, and is inconclusive
    when the interval straddles the bound. ``inconclusive`` says what an inconclusive gate
    does: ``fail``; ``warn`` (passes, with a warning); ``rerun`` (one more repeat, up to
    ``max_reruns``, then as ``warn``). A distribution gate (``~ baseline``) fails only when
    its Mann-Whitney U p-value is below ``alpha`` as well. A history gate (``~ history``) takes
    a change point when Otava's t-test p-value is below ``history_max_pvalue``."""

    confidence: float = Field(0.95, ge=0.5, lt=1, description="of every interval")
    bootstrap_draws: int = Field(1000, ge=100, le=100_000)
    inconclusive: Literal["fail", "warn", "rerun"] = "warn"
    max_reruns: int = Field(2, ge=0, le=50, description="repeats added by 'rerun', at most")
    alpha: float = Field(0.05, gt=0, lt=1, description="distribution gates' significance level")
    history_max_pvalue: float = Field(
        0.001, gt=0, lt=1, description="history gates: a change point's significance (Otava's)"
    )


_PROXY_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"


class NamedProxyConfig(_Strict):
    """One entry of a scenario's ``proxies``: a proxy configuration and its ``name`` (the name
    of its run folder and of its row in the comparison; default: the kind). In TOML the name
    sits beside the proxy's own fields::

        proxies = [{ name = "none", kind = "none" },
                   { name = "nginx-buffered", kind = "nginx", buffering = true }]
    """

    name: str = Field(pattern=_PROXY_NAME, max_length=64)
    proxy: ProxyConfig

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: Any, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        """The entry as the file holds it: a proxy kind's fields with ``name`` beside them."""
        variants = PROXIES.json_schema_variants(handler)
        for variant in variants:
            variant.setdefault("properties", {})["name"] = {
                "type": "string", "pattern": _PROXY_NAME, "maxLength": 64,
                "description": "its run folder's and its comparison row's name; default: the kind",
            }  # fmt: skip
        return {"oneOf": variants, "description": "a proxy configuration and its name"}

    @model_validator(mode="before")
    @classmethod
    def _split_name(cls, data: Any) -> Any:
        if isinstance(data, dict) and "proxy" not in data:
            fields = dict(data)
            name = fields.pop("name", fields.get("kind"))
            return {"name": name, "proxy": fields}
        return data


class ServerNetConfig(_Strict):
    """Kernel TCP buffer settings of the server's network namespace (``[server_net]``), each
    ``[min, default, max]`` bytes as in tcp(7) (``net.ipv4.tcp_wmem``: the send buffer, whose
    size decides how long a stalled client goes unnoticed; ``net.ipv4.tcp_rmem``: the
    receive buffer). Setting either runs the target and proxy in a namespace of their own."""

    tcp_wmem: tuple[int, int, int] | None = None
    tcp_rmem: tuple[int, int, int] | None = None

    @field_validator("tcp_wmem", "tcp_rmem")
    @classmethod
    def _ordered(cls, value: tuple[int, int, int] | None) -> tuple[int, int, int] | None:
        if value is not None and not (0 < value[0] <= value[1] <= value[2]):
            raise ValueError("expected [min, default, max] bytes with 0 < min <= default <= max")
        return value

    def sysctls(self) -> dict[str, str]:
        """``{"net.ipv4.tcp_wmem": "4096 16384 65536", ...}`` for the fields that are set."""
        out = {}
        for name in ("tcp_wmem", "tcp_rmem"):
            value = getattr(self, name)
            if value is not None:
                out[f"net.ipv4.{name}"] = " ".join(str(v) for v in value)
        return out


class NetemConfig(_Strict):
    """How the run builds its links (``[netem]``).

    ``backend``: shaping backend, ``auto`` (probe once: the kernel's netem qdisc where it
    exists, else the fallback), ``netem`` or ``fallback``. ``measure``: measure each shaped
    link (RTT, throughput, loss) before the load starts and store the figures in ``run.json``
    (``measure_duration_s`` of bulk transfer each way, ``measure_udp_packets`` datagrams each
    way for loss).
    ``isolate``: give every group its own namespace and link even when no group names a
    network profile. ``capture``: record TCP headers on each group's client-side veth
    (tcpdump) and analyse them into ``wire.parquet`` (zero windows, window probes, FIN, RST)
    and, per stalled flow, the time from its first zero window to the RST and who sent it.
    ``profiles``: link profiles of this scenario by name
    (``[netem.profiles.my-link]`` with the fields of a link profile), usable as a group's
    ``network_profile`` beside the built-in presets.
    """

    backend: str = "auto"
    measure: bool = True
    measure_duration_s: float = Field(2.0, gt=0, description="bulk transfer each way, s")
    measure_udp_packets: int = Field(300, ge=0, description="UDP datagrams each way; 0: no loss")
    isolate: bool = False
    capture: bool = False
    profiles: dict[str, dict[str, Any]] = {}

    @field_validator("backend")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        valid = ["auto", *BACKENDS.kinds()]
        if value not in valid:
            raise ValueError(f"unknown shaping backend {value!r}; valid: {', '.join(valid)}")
        return value

    @field_validator("profiles")
    @classmethod
    def _valid_profiles(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        from netem import check_profiles

        problems = check_profiles(value)
        if problems:
            raise ValueError("; ".join(problems))
        return value


class IncidentConfig(_Strict):
    """What a scenario of the incident catalogue (``scenarios/incidents/``) reproduces, for
    ``zerowindow suite run``. ``source``: the public reports it comes from (issue numbers,
    write-ups); ``summary``: the failure in one line. The scenario's ``gates`` are failures of
    the stack under test (the suite's test case fails); ``findings`` are gates whose outcome is
    reported but never fails the case: what a stack is known to do that is worth knowing
    (vLLM never aborts a stalled client)."""

    source: str = Field(min_length=1)
    summary: str = ""
    findings: list[GateField] = []


class HistoryConfig(_Strict):
    """Where the runs of a scenario are remembered (``harness.history``): ``path`` of the
    DuckDB file (default: ``history.duckdb`` in the results folder); ``enabled = false`` keeps
    no history. ``--history``/``--no-history`` and ``ZEROWINDOW_HISTORY`` come first."""

    path: Path | None = None
    enabled: bool = True


class TracesConfig(_Strict):
    """Where the run's traces go besides ``traces.otlp.json`` (``harness.outputs._otlp_send``):
    ``otlp_endpoint``, an OTLP/HTTP URL (``http://127.0.0.1:4318``: ``/v1/traces`` is appended
    to a URL without a path), else ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, else
    ``OTEL_EXPORTER_OTLP_ENDPOINT``; none: not sent. A sending that fails is a warning."""

    otlp_endpoint: str | None = Field(
        None, pattern=r"^https?://", description="OTLP/HTTP traces endpoint (protobuf bodies)"
    )
    timeout_s: float = Field(10.0, gt=0, description="per request to the endpoint")


class Scenario(_Strict):
    """A whole experiment. ``proxy`` stands between the clients and the target (default: none).
    ``proxies`` instead lists several proxy configurations: the same workload then runs through
    each in turn against one target (see ``harness.lifecycle._plan_run``).
    ``max_duration_s`` bounds the load phase; ``cooldown_s`` is how long the collectors keep
    sampling after the last load process ended. ``plugins`` are modules or ``.py`` files that
    register kinds of their own (:func:`zwcore.load_plugins`), imported before the rest is
    validated."""

    plugins: list[str] = []
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: str = ""
    seed: int = 0
    max_duration_s: float = Field(600.0, gt=0)
    cooldown_s: float = Field(3.0, ge=0)
    target: TargetConfig
    proxy: ProxyConfig = NoProxyConfig()
    proxies: list[NamedProxyConfig] = []
    groups: list[UserGroupConfig] = Field(min_length=1)
    collectors: CollectorConfig = CollectorConfig()
    verdict: VerdictConfig = VerdictConfig()
    control: bool = Field(
        False,
        description="also run the same schedule without the aggressor groups, and report the "
        "others' impact (impact.<group>.<figure>) with intervals",
    )
    gates: list[GateField] = Field(
        [],
        description="SLO gates such as 'fast.ttft_p99_ms <= 800' "
        "(see harness.scenario._gate_syntax)",
    )
    repeats: int = Field(
        1,
        ge=1,
        le=100,
        description="run the workload this many times against one target (started once) and "
        "gate on the figures of all of them, with intervals",
    )
    gating: GatingConfig = GatingConfig()
    history: HistoryConfig = HistoryConfig()
    traces: TracesConfig = TracesConfig()

    @field_validator("gates")
    @classmethod
    def _known_figures(cls, gates: list[Gate], info: ValidationInfo) -> list[Gate]:
        groups = info.data.get("groups")
        if groups is None:  # the groups did not validate: that error is reported instead
            return gates
        proxies = [info.data.get("proxy") or NoProxyConfig()]
        proxies += [p.proxy for p in info.data.get("proxies") or []]
        check_figures(gates, groups, control=bool(info.data.get("control")), proxies=proxies)
        return gates

    netem: NetemConfig = NetemConfig()
    server_net: ServerNetConfig | None = None
    placement: PlacementConfig = PlacementConfig()
    matrix: MatrixConfig | None = Field(
        None, description="the disconnect matrix: phases x ways of leaving (its own groups)"
    )
    incident: IncidentConfig | None = Field(
        None, description="what incident this scenario reproduces (for zerowindow suite)"
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_matrix(cls, data: Any) -> Any:
        return expand_matrix(data)

    @model_validator(mode="after")
    def _known_finding_figures(self) -> Scenario:
        if self.incident is not None:
            try:
                proxies = [self.proxy, *(p.proxy for p in self.proxies)]
                check_figures(self.incident.findings, self.groups, proxies=proxies)
            except PydanticCustomError as exc:  # reported at the finding, so at its line
                details: list[InitErrorDetails] = [
                    {"type": exc, "loc": ("incident", "findings"), "input": None}
                ]
                raise ValidationError.from_exception_data(type(self).__name__, details) from None
        return self

    @model_validator(mode="after")
    def _control_has_both_sides(self) -> Scenario:
        if self.control:
            aggressors = [g.name for g in self.groups if g.aggressor]
            if not aggressors or len(aggressors) == len(self.groups):
                raise ValueError(
                    "control = true needs aggressor groups (aggressor = true) and others: the "
                    f"control arm runs without the aggressors (here: {aggressors or 'none'})"
                )
        return self

    @model_validator(mode="after")
    def _matrix_fits(self) -> Scenario:
        if self.matrix is not None and self.max_duration_s < self.matrix.timeline_s + 5:
            raise ValueError(
                f"max_duration_s = {self.max_duration_s:g} is too short for the matrix: its "
                f"{len(self.matrix.cells())} cells and control take "
                f"{self.matrix.timeline_s:g} s (give at least {self.matrix.timeline_s + 5:g})"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        # Already imported by parse_scenario (with the file's location on error); this loads
        # them where a scenario is validated from elsewhere (run.json, the Python API).
        if isinstance(data, dict) and isinstance(plugins := data.get("plugins"), list):
            load_plugins([p for p in plugins if isinstance(p, str)])
        return data

    @model_validator(mode="after")
    def _known_network_profiles(self) -> Scenario:
        """Each group's ``network_profile`` names a preset or a ``[netem.profiles]`` entry;
        an unknown one is reported at the group's field (so at its line in the file)."""
        from netem import unknown_profile

        errors: list[InitErrorDetails] = [
            {
                "type": "value_error",
                "loc": ("groups", i, "network_profile"),
                "input": g.network_profile,
                "ctx": {"error": ValueError(problem)},
            }
            for i, g in enumerate(self.groups)
            if (problem := unknown_profile(g.network_profile, self.netem.profiles)) is not None
        ]
        if errors:
            raise ValidationError.from_exception_data(type(self).__name__, errors)
        return self

    def needs_topology(self) -> bool:
        """Whether the run builds namespaces and links: a group names a network profile,
        ``[server_net]`` is set, or ``[netem] isolate`` asks for it."""
        shaped = any(g.network_profile != "none" for g in self.groups)
        return shaped or self.server_net is not None or self.netem.isolate

    @model_validator(mode="after")
    def _groups_start_in_time(self) -> Scenario:
        late = [g.name for g in self.groups if g.start_after_s >= self.max_duration_s]
        if late:
            raise ValueError(
                f"groups {', '.join(late)} start_after_s is not below "
                f"max_duration_s={self.max_duration_s:g}"
            )
        return self

    @model_validator(mode="after")
    def _one_way_to_name_proxies(self) -> Scenario:
        if self.proxies and self.proxy != NoProxyConfig():
            raise ValueError("set either proxy or proxies, not both")
        names = [p.name for p in self.proxies]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"proxy names must be unique; repeated: {', '.join(duplicates)}")
        return self

    @field_validator("groups")
    @classmethod
    def _unique_names(cls, groups: list[UserGroupConfig]) -> list[UserGroupConfig]:
        names = [g.name for g in groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"group names must be unique; repeated: {', '.join(duplicates)}")
        return groups
