"""The ``llama-cpp-python`` target kind: llama-cpp-python's OpenAI server, started for the run
with the engine probe (``harness._engine_probe._llamacpp_python``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._health import TargetError
from harness.servers._launched import LaunchedTarget
from harness.servers._metric_names import MetricNames
from harness.servers._versions import package_version

INSTALL_HINT = (
    "install it with `make engines` (or `pip install 'llama-cpp-python[server]==0.3.36'`; "
    "it compiles llama.cpp, about 5 min on 2 CPUs)"
)
GGUF_HINT = "`zerowindow model tiny models/tiny --format gguf` makes the tiny test model"
LLAMACPP_PYTHON_METRICS = MetricNames(
    kv_cache_usage=("llamacpp_python:context_usage_perc",),
    num_requests_running=("llamacpp_python:requests_running",),
    num_requests_waiting=("llamacpp_python:requests_waiting",),
    generation_tokens_total=("llamacpp_python:generation_tokens_total",),
)
"""The names the probe wrapper serves (harness/_engine_probe/_llamacpp_python.py; the server
itself serves no metrics): the one context's usage (1 while a request holds the model lock),
requests holding and waiting for the lock, tokens generated. The wrapper's
``llamacpp_python:request_success_total`` is not read (the run never has)."""


@TARGETS.register
class LlamaCppPythonTargetConfig(TargetConfigBase):
    """Start llama-cpp-python's OpenAI-compatible server (``python -m llama_cpp.server``,
    through the probe wrapper that records the model lock and every token) for the run.

    ``model`` is a GGUF file. The options are the server's own (llama_cpp/server/settings.py)
    under the same names; ``interrupt_requests`` keeps the server's default (true: a streaming
    request stops early when another request waits, between two of its tokens).
    ``extra_args`` are passed as they are, e.g. ``["--n_batch", "64"]``.
    """

    metric_names: ClassVar[MetricNames | None] = LLAMACPP_PYTHON_METRICS
    writes_tables: ClassVar[bool] = True  # the probe wrapper

    kind: Literal["llama-cpp-python"] = "llama-cpp-python"
    model: str = "models/tiny/tiny.gguf"
    served_model_name: str = "tiny"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    python: str | None = Field(None, description="interpreter with llama_cpp; default: this one")
    n_ctx: int = Field(8192, gt=0, description="context size (tokens)")
    n_threads: int | None = Field(
        None, gt=0, description="generation threads; default: the server's"
    )
    interrupt_requests: bool = True
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(60.0, gt=0)
    stop_grace_s: float = Field(5.0, gt=0)

    def build(self) -> Target:
        return LlamaCppPythonTarget(self)


class LlamaCppPythonTarget(LaunchedTarget):
    """llama-cpp-python's server in its own process group, its log ``llama-cpp-python.log`` in
    the run folder, where the probe writes the engine tables."""

    kind: ClassVar[str] = "llama-cpp-python"
    label: ClassVar[str] = "llama-cpp-python"
    log_name: ClassVar[str] = "llama-cpp-python.log"
    config: LlamaCppPythonTargetConfig

    def start(self, run_dir: Path) -> None:
        """Start the server; a missing GGUF file or a missing ``llama_cpp`` fails first with
        what to do. Raises :class:`~zwcore.TargetError`."""
        require_gguf(self.config.model)
        if not _has_llama_cpp(self.config.python):
            python = self.config.python or sys.executable
            raise TargetError(f"llama-cpp-python is not installed in {python}; {INSTALL_HINT}")
        super().start(run_dir)

    def versions(self) -> dict[str, str | None]:
        """llama-cpp-python's, in the interpreter that runs the server (``python``, default:
        this one)."""
        return {"llama-cpp-python": package_version("llama-cpp-python", python=self.config.python)}

    def build_argv(self) -> list[str]:
        c = self.config
        argv = [
            c.python or sys.executable,
            "-m", "harness._engine_probe._llamacpp_python",
            "--model", str(require_gguf(c.model)),
            "--model_alias", c.served_model_name,
            "--host", c.host,
            "--port", str(self.port),
            "--n_ctx", str(c.n_ctx),
            "--interrupt_requests", str(c.interrupt_requests),
        ]  # fmt: skip
        if c.n_threads is not None:
            argv += ["--n_threads", str(c.n_threads)]
        return argv + list(c.extra_args)

    def launch_env(self) -> dict[str, str]:
        """As for any launched target, with this checkout first on ``PYTHONPATH`` (the probe
        wrapper must import in the engine's interpreter, whichever it is)."""
        env = super().launch_env()
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = ":".join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        return env


def require_gguf(model: str) -> Path:
    """``model`` (``target.model``) as an absolute path. Raises :class:`~zwcore.TargetError`
    naming the file and how to make the tiny one when it is not a file."""
    path = Path(model).expanduser().resolve()
    if not path.is_file():
        raise TargetError(
            f"GGUF model file {str(path)!r} does not exist (target.model = {model!r}); {GGUF_HINT}"
        )
    return path


def _has_llama_cpp(python: str | None) -> bool:
    """Whether ``llama_cpp.server`` imports in ``python`` (default: this interpreter)."""
    if python is None:
        return importlib.util.find_spec("llama_cpp") is not None
    probe = [python, "-c", "import llama_cpp.server"]
    return subprocess.run(probe, capture_output=True, check=False).returncode == 0
