"""The ``llama-server`` target kind: llama.cpp's C++ OpenAI-compatible server, started for the
run. It writes no engine tables; the run samples its ``/metrics``, ``/slots`` and its process's
threads and RSS instead (``harness.collectors.MetricsScraper``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from harness.servers._base import TARGETS, Target, TargetConfigBase
from harness.servers._health import TargetError
from harness.servers._launched import LaunchedTarget
from harness.servers._llama_build import find_llama_server
from harness.servers._llamacpp_python import require_gguf
from harness.servers._metric_names import MetricNames

BUILD_HINT = (
    "build it with `make engines` or `zerowindow engine build llama-server` (about 11 min on "
    "2 CPUs, cached), or name a binary in target.binary or $ZEROWINDOW_LLAMA_SERVER"
)
LLAMA_SERVER_METRICS = MetricNames(
    num_requests_running=("llamacpp:requests_processing",),
    num_requests_waiting=("llamacpp:requests_deferred",),
    generation_tokens_total=("llamacpp:tokens_predicted_total",),
)
"""llama-server's metric names with ``--metrics`` (tools/server/server-context.cpp of llama.cpp):
no KV usage (``GET /slots`` gives one, :attr:`LlamaServerTarget.serves_slots`), no preemptions,
no finish reasons, no latency histograms."""
VERSION_TIMEOUT_S = 15.0


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

    metric_names: ClassVar[MetricNames | None] = LLAMA_SERVER_METRICS
    writes_tables: ClassVar[bool] = False  # a C++ server: no probe loads into it

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
        self.probe_note = (
            "llama-server: no probe can load into a C++ server; its evidence is sampled from "
            "/metrics, /slots and its process (threads, RSS)"
        )

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

    def versions(self) -> dict[str, str | None]:
        """``llama-server``: the version line of the binary (``version: 0.5.0-dev (build 0,
        commit unknown)`` says ``0.5.0-dev (build 0, commit unknown)``), from the
        ``build.json`` beside a toolkit build (``harness.servers.build_llama_server``, which
        also names the llama-cpp-python sdist it vendors llama.cpp from) or else from
        ``llama-server --version``; ``None`` when there is no binary or it does not say."""
        try:
            binary = self.binary()
        except TargetError:
            return {"llama-server": None}
        record = binary.parent.parent / "build.json"
        try:
            facts = json.loads(record.read_text())
            lines = [str(line) for line in facts["llama_server_version"]]
            sdist = str(facts["llama_cpp_python_version"])
        except (OSError, ValueError, KeyError, TypeError):
            lines, sdist = _version_lines(binary), None
        said = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("version:")]
        found = said[0] if said else None
        out: dict[str, str | None] = {"llama-server": found}
        if sdist is not None:
            out["llama-server-source"] = f"llama-cpp-python {sdist} sdist (vendor/llama.cpp)"
        return out

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


def _version_lines(binary: Path) -> list[str]:
    """What ``binary --version`` prints (llama.cpp prints it on stderr), or ``[]``."""
    try:
        done = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True,
            timeout=VERSION_TIMEOUT_S, check=False,
        )  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in (done.stdout + done.stderr).splitlines()]
