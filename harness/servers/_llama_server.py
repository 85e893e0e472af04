"""The ``llama-server`` target kind: llama.cpp's C++ OpenAI-compatible server, started for the
run. It writes no engine tables; the run samples its ``/metrics``, ``/slots`` and its process's
threads and RSS instead (``harness.collectors.MetricsScraper``)."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._health import TargetError
from harness.servers._launched import LaunchedTarget
from harness.servers._llama_build import find_llama_server
from harness.servers._llamacpp_python import require_gguf

BUILD_HINT = (
    "build it with `make engines` or `zerowindow engine build llama-server` (about 11 min on "
    "2 CPUs, cached), or name a binary in target.binary or $ZEROWINDOW_LLAMA_SERVER"
)


@TARGETS.register
class LlamaServerTargetConfig(TargetConfigBase):
    """Start llama.cpp's ``llama-server`` for the run, with ``--metrics`` and ``/slots`` on and
    the web UI off.

    ``model`` is a GGUF file; ``binary`` the executable (default: ``$ZEROWINDOW_LLAMA_SERVER``,
    then the toolkit's cached build, then ``llama-server`` on ``PATH``). The options are the
    server's own (``llama-server --help``): ``parallel`` slots share ``n_ctx`` context
    tokens; ``threads_http`` HTTP worker threads (``None``: the server's default); ``timeout_s``
    the server's read/write timeout (s). ``extra_args`` are passed as they are.
    """

    kind: Literal["llama-server"] = "llama-server"
    model: str = "models/tiny/tiny.gguf"
    served_model_name: str = "tiny"
    binary: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    n_ctx: int = Field(8192, gt=0, description="context size (tokens), shared by the slots")
    parallel: int = Field(4, gt=0, description="slots: requests decoded at once")
    threads: int | None = Field(None, gt=0, description="generation threads")
    threads_http: int | None = Field(None, gt=0, description="HTTP worker threads")
    timeout_s: float = Field(3600.0, gt=0, description="server read/write timeout (s)")
    extra_args: list[str] = []
    env: dict[str, str] = {}
    startup_timeout_s: float = Field(60.0, gt=0)
    stop_grace_s: float = Field(5.0, gt=0)

    def build(self) -> Target:
        return LlamaServerTarget(self)


class LlamaServerTarget(LaunchedTarget):
    """``llama-server`` in its own process group, its log ``llama-server.log`` in the run
    folder."""

    kind: ClassVar[str] = "llama-server"
    label: ClassVar[str] = "llama-server"
    log_name: ClassVar[str] = "llama-server.log"
    serves_slots: ClassVar[bool] = True
    config: LlamaServerTargetConfig

    def __init__(self, config: LlamaServerTargetConfig) -> None:
        super().__init__(config)
        self.probe_requested = "off"
        self.probe_note = (
            "llama-server: no probe can load into a C++ server; its evidence is sampled from "
            "/metrics, /slots and its process (threads, RSS)"
        )

    @property
    def writes_tables(self) -> bool:
        return False

    def binary(self) -> Path:
        """The executable to run. Raises :class:`~zwcore.TargetError` when there is none."""
        if self.config.binary is not None:
            path = Path(self.config.binary).expanduser()
            if not path.is_file():
                raise TargetError(f"target.binary {str(path)!r} does not exist; {BUILD_HINT}")
            return path
        try:
            found = find_llama_server()
        except RuntimeError as exc:  # $ZEROWINDOW_LLAMA_SERVER names no executable
            raise TargetError(str(exc)) from None
        if found is None:
            raise TargetError(f"no llama-server binary found; {BUILD_HINT}")
        return found

    def start(self, run_dir: Path) -> None:
        """Start the server; a missing GGUF file or binary fails first with what to do.
        Raises :class:`~zwcore.TargetError`."""
        require_gguf(self.config.model)
        super().start(run_dir)

    def build_argv(self) -> list[str]:
        c = self.config
        argv = [
            str(self.binary()),
            "--model", str(require_gguf(c.model)),
            "--alias", c.served_model_name,
            "--host", c.host,
            "--port", str(self.port),
            "--ctx-size", str(c.n_ctx),
            "--parallel", str(c.parallel),
            "--timeout", f"{c.timeout_s:g}",
            "--metrics", "--slots", "--no-webui",
        ]  # fmt: skip
        if c.threads is not None:
            argv += ["--threads", str(c.threads)]
        if c.threads_http is not None:
            argv += ["--threads-http", str(c.threads_http)]
        return argv + list(c.extra_args)
