"""The ``url`` target kind: a server that is already running, reached by its URL."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from harness._engine_probe import STATUS_FILE, read_status
from harness.servers._base import TARGETS, Target, TargetConfigBase, known_metric_names
from harness.servers._health import TargetError
from harness.servers._metric_names import MetricNames
from harness.servers._readiness import AutoReadiness, ReadinessConfig, wait_ready


@TARGETS.register
class UrlTargetConfig(TargetConfigBase):
    """Attach to a server that is already running at ``url`` (scheme, host, port), once it is
    ready by ``readiness`` (``harness.servers._readiness``: ``auto``, ``http``, ``completion``,
    ``none``) within ``startup_timeout_s``. Its ``/metrics`` is read by the names of every
    registered target kind (the kind of that server is not known)."""

    kind: Literal["url"] = "url"
    url: str
    served_model_name: str
    startup_timeout_s: float = Field(30.0, gt=0)
    readiness: ReadinessConfig = Field(
        default_factory=AutoReadiness,
        description="what must answer before the load starts: auto (GET /health 200, else "
        "GET /v1/models 200), http (path, statuses), completion (one token), none",
    )
    engine_dir: str | None = Field(
        None,
        description="the folder where that server's engine writes its own tables: the "
        "ZEROWINDOW_ENGINE_DIR of a vLLM started with --scheduler-cls "
        "harness._engine_probe._vllm_scheduler.EngineProbe (docs/engine-probe.md)",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        expected = "expected http://HOST:PORT such as http://127.0.0.1:8000"
        try:
            url = urlsplit(value)
            url.port  # noqa: B018 - raises ValueError for a port that is not a number 0..65535
        except ValueError as exc:
            raise ValueError(f"{expected} ({exc})") from None
        if url.scheme != "http" or not url.hostname or value != value.strip():
            raise ValueError(f"{expected} (the load generator speaks plain HTTP/1.1)")
        if url.path.strip("/") or url.query or url.fragment or url.username:
            raise ValueError(f"{expected}, without path, query or fragment")
        return value.rstrip("/")

    def build(self) -> Target:
        return UrlTarget(self)


class UrlTarget(Target):
    """A server that is already running; the run neither starts nor stops it."""

    kind: ClassVar[str] = "url"
    config: UrlTargetConfig

    def __init__(self, config: UrlTargetConfig) -> None:
        self.config = config
        self.base_url = config.url
        self.served_model_name = config.served_model_name
        self.engine_dir = Path(config.engine_dir) if config.engine_dir else None
        self.readiness_result: str | None = None  # what answered, once started

    def metric_names(self) -> tuple[MetricNames, ...]:
        """Those of every registered target kind (:func:`known_metric_names`): the server may
        be any engine, one a plugin registered included."""
        return known_metric_names()

    def engine_probe(self) -> dict[str, Any]:
        facts = super().engine_probe()
        return facts if self.engine_dir is None else {**facts, "dir": str(self.engine_dir)}

    def start(self, run_dir: Path) -> None:
        """Wait until the server is ready (``readiness``); with ``engine_dir``, check that its
        engine writes its tables there. Raises :class:`~zwcore.TargetError`."""
        where = f"[target] engine_dir {self.engine_dir}"
        if self.engine_dir is not None and not self.engine_dir.is_dir():
            raise TargetError(f"{where}: no such folder")
        self.readiness_result = wait_ready(
            self.config.readiness,
            self.base_url,
            model=self.served_model_name,
            timeout_s=self.config.startup_timeout_s,
        )
        if self.engine_dir is not None and not read_status(self.engine_dir):
            raise TargetError(
                f"{where} holds no {STATUS_FILE}: is the server's engine running with the "
                "probe and ZEROWINDOW_ENGINE_DIR set to it? (docs/engine-probe.md)"
            )

    def failure(self) -> str | None:
        return None

    def stop(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        readiness = {**self.config.readiness.model_dump(), "result": self.readiness_result}
        return {"kind": self.kind, "base_url": self.base_url, "readiness": readiness}
