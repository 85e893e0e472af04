"""The ``sim`` target kind: the built-in engine emulator (``harness._sim``) started for the run."""

from __future__ import annotations

import sys
from typing import ClassVar, Literal

from pydantic import Field

from harness._model_options import model_argv
from harness._sim import SimConfig
from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._launched import LaunchedTarget
from harness.servers._metric_names import MetricNames
from harness.servers._versions import package_version
from harness.servers._vllm import VLLM_METRICS
from zwcore import ScenarioError


@TARGETS.register
class SimTargetConfig(TargetConfigBase):
    """Start the built-in engine emulator for the run. ``engine`` holds its settings
    (``kv_release``, ``num_blocks``, ``block_size``, step-time model...; see
    ``harness._sim.SimConfig``)."""

    metric_names: ClassVar[MetricNames | None] = VLLM_METRICS  # harness/_sim/_metrics.py
    writes_tables: ClassVar[bool] = True

    kind: Literal["sim"] = "sim"
    served_model_name: str = "sim"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    engine: SimConfig = SimConfig()
    startup_timeout_s: float = Field(30.0, gt=0)
    stop_grace_s: float = Field(5.0, gt=0)

    def build(self) -> Target:
        return SimTarget(self)

    @classmethod
    def for_suite(cls, *, model: str | None) -> SimTargetConfig:
        """The emulator with its defaults. Raises :class:`~zwcore.ScenarioError` for a
        ``model``: the emulator loads none."""
        if model is not None:
            raise ScenarioError(f"--model {model} with --target sim: the emulator loads no model")
        return cls()


class SimTarget(LaunchedTarget):
    """The built-in engine emulator, ``python -m harness._sim``, with the scenario's ``engine``
    settings as options. Its log is ``sim.log`` in the run folder, where it also writes its
    engine tables (told by ``ZEROWINDOW_ENGINE_DIR``)."""

    kind: ClassVar[str] = "sim"
    label: ClassVar[str] = "sim"
    log_name: ClassVar[str] = "sim.log"
    config: SimTargetConfig

    def versions(self) -> dict[str, str | None]:
        """The emulator's: the toolkit's own version (it ships with it)."""
        return {"sim": package_version("zerowindow")}

    def build_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "harness._sim", "--host", self.config.host]
        argv += ["--port", str(self.port), "--log-level", "warning"]
        engine = self.config.engine.model_copy(
            update={"served_model_name": self.config.served_model_name}
        )
        return argv + model_argv(engine.model_dump(exclude_none=True))
