"""The ``command`` target and proxy kinds: any server started from a command-line template.

A scenario names the program and its arguments (``argv``), the environment and working
directory it runs with, how to tell it is ready (``readiness``, the registry of
``harness.servers._readiness``), how to stop it (``stop_signal``, then SIGKILL after
``stop_grace_s``) and, for a target, the Prometheus names its figures are served under
(``metrics``: a preset name such as ``"vllm"`` or ``"sglang"``, or a table of names). Its
output goes to a log in the run folder; the run places it (network namespace, CPUs) as it
places any server of its role. So SGLang, TGI or Ollama behind an in-house gateway run without a
line of Python.

Placeholders, filled when the server starts (``str.format`` fields; ``{{`` and ``}}`` are
literal braces), in ``argv`` and in the values of ``env``:

- target: ``{host}``, ``{port}`` (where it must listen; port 0 in the options picks a free one),
  ``{model}`` (``served_model_name``), ``{run_dir}`` (the run folder, absolute);
- proxy: ``{host}``, ``{port}``, ``{listen}`` (``host:port``), ``{upstream}`` (the URL it
  forwards to, ``http://host:port``), ``{upstream_host}``, ``{upstream_port}``, ``{run_dir}``.

A placeholder outside these is an error when the scenario is loaded.
"""

from __future__ import annotations

import signal
import string
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from harness.servers._base import (
    PROXIES,
    TARGETS,
    Proxy,
    ProxyConfigBase,
    StrictOptions,
    Target,
    TargetConfigBase,
    metric_presets,
)
from harness.servers._configured import split_upstream
from harness.servers._health import free_port
from harness.servers._launched import LaunchedTarget
from harness.servers._metric_names import MetricNames
from harness.servers._process import ServerProcess
from harness.servers._readiness import AutoReadiness, Readiness, ReadinessConfig
from zwcore import TargetError

TARGET_PLACEHOLDERS = ("host", "port", "model", "run_dir")
PROXY_PLACEHOLDERS = (
    "host", "port", "listen", "upstream", "upstream_host", "upstream_port", "run_dir",
)  # fmt: skip
StopSignal = Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGHUP", "SIGUSR1", "SIGUSR2", "SIGKILL"]


def placeholders(text: str) -> list[str]:
    """The ``str.format`` field names in ``text`` (``{{``/``}}`` are literal braces). Raises
    ``ValueError`` for malformed braces."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def check_template(texts: list[str], allowed: tuple[str, ...]) -> None:
    """Raise ``ValueError`` naming the first placeholder of ``texts`` not in ``allowed`` (or
    malformed braces), and the placeholders there are."""
    for text in texts:
        try:
            names = placeholders(text)
        except ValueError as exc:
            raise ValueError(f"{text!r}: {exc} (write {{{{ and }}}} for literal braces)") from None
        for name in names:
            if name not in allowed:
                valid = ", ".join("{" + a + "}" for a in allowed)
                raise ValueError(f"{text!r}: unknown placeholder {{{name}}}; valid: {valid}")


def render(texts: list[str], values: dict[str, object]) -> list[str]:
    """``texts`` with their placeholders filled from ``values`` (checked beforehand)."""
    return [text.format_map(values) for text in texts]


def render_env(env: dict[str, str], values: dict[str, object]) -> dict[str, str]:
    """``env`` with the placeholders of its values filled from ``values``."""
    return {name: text.format_map(values) for name, text in env.items()}


class CommandOptions(StrictOptions):
    """What both ``command`` kinds take: the command line and how to run, wait for and stop
    it. Validation errors: an empty ``argv``, an unknown placeholder, malformed braces."""

    argv: list[str] = Field(
        ..., min_length=1, description="the program and its arguments, with placeholders"
    )
    env: dict[str, str] = Field({}, description="variables added to its environment")
    cwd: str | None = Field(
        None, description="its working directory (relative: to where zerowindow runs)"
    )
    readiness: ReadinessConfig = Field(
        default_factory=AutoReadiness,
        description="what must answer before the load starts: auto (GET /health 200, else "
        "GET /v1/models 200), http (path, statuses), completion (one token), none",
    )
    startup_timeout_s: float = Field(60.0, gt=0)
    stop_signal: StopSignal = Field("SIGTERM", description="sent to its process group to stop")
    stop_grace_s: float = Field(10.0, gt=0, description="then SIGKILL")
    allowed: ClassVar[tuple[str, ...]] = ()

    @property
    def stop_signum(self) -> int:
        """:attr:`stop_signal`'s number."""
        return int(signal.Signals[self.stop_signal])

    @model_validator(mode="after")
    def _templates(self) -> CommandOptions:
        check_template([*self.argv, *self.env.values()], self.allowed)
        return self


class MetricNamesOptions(StrictOptions):
    """A ``command`` target's Prometheus names, one list of names tried in order per figure
    (as ``harness.servers.MetricNames``; a figure left out is not served)."""

    kv_cache_usage: list[str] = []
    num_requests_running: list[str] = []
    num_requests_waiting: list[str] = []
    num_preemptions_total: list[str] = []
    generation_tokens_total: list[str] = []
    request_success_total: list[str] = []
    finish_reason_label: str = "finished_reason"
    ttft_seconds: list[str] = []
    itl_seconds: list[str] = []
    e2e_seconds: list[str] = []

    def names(self) -> MetricNames:
        """These names as ``MetricNames``."""
        lists = {k: tuple(v) for k, v in self if k != "finish_reason_label"}
        return MetricNames(finish_reason_label=self.finish_reason_label, **lists)


@TARGETS.register
class CommandTargetConfig(CommandOptions, TargetConfigBase):
    """Start any server from a command line. ``argv`` and the values of ``env`` may hold
    ``{host}``, ``{port}`` (where it must listen), ``{model}`` (``served_model_name``) and
    ``{run_dir}`` (the run folder); ``{{``/``}}`` are literal braces. Its output is
    ``command-target.log`` in the run folder. Its ``/metrics`` is read by ``metrics``: a preset
    (a target kind's names: ``vllm``, ``llama-server``..., or ``sglang``), a table of names, or
    none (nothing is read). ``engine_tables``: its engine writes the engine tables into
    ``$ZEROWINDOW_ENGINE_DIR`` (the emulator, vLLM with the engine probe)."""

    kind: Literal["command"] = "command"
    served_model_name: str
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    metrics: str | MetricNamesOptions | None = Field(
        None, description="a preset name (a target kind's, or sglang) or a table of names"
    )
    engine_tables: bool = False
    allowed: ClassVar[tuple[str, ...]] = TARGET_PLACEHOLDERS

    @field_validator("metrics")
    @classmethod
    def _preset(cls, value: str | MetricNamesOptions | None) -> str | MetricNamesOptions | None:
        if isinstance(value, str) and value not in metric_presets():
            raise ValueError(f"unknown preset {value!r}; valid: {', '.join(metric_presets())}")
        return value

    def names(self) -> MetricNames | None:
        """The metric names ``metrics`` gives (``None``: none)."""
        if isinstance(self.metrics, str):
            return metric_presets()[self.metrics]
        return None if self.metrics is None else self.metrics.names()

    def build(self) -> Target:
        return CommandTarget(self)


class CommandTarget(LaunchedTarget):
    """A ``command`` target: its log is ``command-target.log`` in the run folder."""

    kind: ClassVar[str] = "command"
    label: ClassVar[str] = "command"
    log_name: ClassVar[str] = "command-target.log"
    config: CommandTargetConfig

    def __init__(self, config: CommandTargetConfig) -> None:
        super().__init__(config)
        self.server = ServerProcess(f"command {Path(config.argv[0]).name}")
        self.probe_loaded = config.engine_tables
        self.probe_requested = "on" if config.engine_tables else "off"
        self.probe_note = "engine_tables = false: the command's engine writes no tables"
        self.cwd = Path(config.cwd) if config.cwd else None
        self._run_dir = Path(".")

    def _values(self) -> dict[str, object]:
        c = self.config
        run_dir = str(self._run_dir.resolve())
        return {"host": c.host, "port": self.port, "model": c.served_model_name, "run_dir": run_dir}

    def build_argv(self) -> list[str]:
        return render(self.config.argv, self._values())

    def launch_env(self) -> dict[str, str]:
        return {"HF_HUB_OFFLINE": "1", **render_env(self.config.env, self._values())}

    def start(self, run_dir: Path) -> None:
        """Render the command for ``run_dir``, start it and wait for its readiness. Raises
        :class:`~zwcore.TargetError` quoting its log's last error."""
        self._run_dir = run_dir
        super().start(run_dir)

    def ready_when(self) -> Readiness:
        return self.config.readiness

    def stop(self) -> None:
        self.server.stop(grace_s=self.config.stop_grace_s, sig=self.config.stop_signum)

    def metric_names(self) -> tuple[MetricNames, ...]:
        names = self.config.names()
        return () if names is None else (names,)

    def describe(self) -> dict[str, Any]:
        readiness = {**self.config.readiness.model_dump(), "result": self.readiness_result}
        return {**super().describe(), "readiness": readiness, "metrics": self.config.metrics}


@PROXIES.register
class CommandProxyConfig(CommandOptions, ProxyConfigBase):
    """Start any proxy or gateway from a command line. ``argv`` and the values of ``env`` may
    hold ``{listen}`` (``host:port`` where it must listen), ``{host}``, ``{port}``,
    ``{upstream}`` (the URL it forwards to), ``{upstream_host}``, ``{upstream_port}`` and
    ``{run_dir}``; ``{{``/``}}`` are literal braces. Its output is ``command-proxy.log`` in the
    run folder. ``readiness`` is asked through it (``completion`` is not offered: a proxy is
    not told the model's name)."""

    kind: Literal["command"] = "command"
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    allowed: ClassVar[tuple[str, ...]] = PROXY_PLACEHOLDERS

    @field_validator("readiness")
    @classmethod
    def _no_completion(cls, value: Any) -> Any:
        if value.kind == "completion":
            raise ValueError("completion needs the model's name: use auto, http or none")
        return value

    def build(self) -> Proxy:
        return CommandProxy(self)


class CommandProxy(Proxy):
    """A ``command`` proxy: its log is ``command-proxy.log`` in the run folder."""

    kind: ClassVar[str] = "command"

    def __init__(self, config: CommandProxyConfig) -> None:
        self.config = config
        self.port = config.listen_port or free_port(config.listen_host)
        self.server = ServerProcess(f"command proxy {Path(config.argv[0]).name}")
        self.argv: list[str] = []
        self.readiness_result: str | None = None

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Render the command, start it and wait for its readiness through it; return the URL
        clients use. Raises :class:`~zwcore.TargetError`."""
        c = self.config
        up_host, up_port = split_upstream(upstream_url)
        values = {
            "host": c.listen_host, "port": self.port, "listen": f"{c.listen_host}:{self.port}",
            "upstream": upstream_url.rstrip("/"), "upstream_host": up_host,
            "upstream_port": up_port, "run_dir": str(run_dir.resolve()),
        }  # fmt: skip
        self.argv = render(c.argv, values)
        env = render_env(c.env, values)
        url = f"http://{c.listen_host}:{self.port}"
        log_path = run_dir / "command-proxy.log"
        try:
            self.readiness_result = self.server.launch(
                self.argv, log_path=log_path, url=url, timeout_s=c.startup_timeout_s, env=env,
                cwd=Path(c.cwd) if c.cwd else None, readiness=c.readiness,
            )  # fmt: skip
        except TargetError as exc:
            self.stop()
            raise TargetError(f"{self.server.label}: {exc}; see {log_path}") from None
        return url

    def processes(self) -> list[ServerProcess]:
        return [self.server]

    def stop(self) -> None:
        self.server.stop(grace_s=self.config.stop_grace_s, sig=self.config.stop_signum)

    def describe(self) -> dict[str, Any]:
        readiness = {**self.config.readiness.model_dump(), "result": self.readiness_result}
        return {
            "kind": self.kind, "argv": self.argv,
            "listen": f"{self.config.listen_host}:{self.port}", "readiness": readiness,
            "config": self.config.model_dump(mode="json"),
        }  # fmt: skip
