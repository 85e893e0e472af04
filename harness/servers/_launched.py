"""What the target kinds the run starts as a child process (vLLM, the emulator) share: a free
port, a process group with its log in the run folder, the health check, and the log lines that
mean the engine died."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, ClassVar

from harness._engine_probe import ENGINE_DIR_ENV
from harness.servers._base import Target
from harness.servers._health import TargetError, free_port
from harness.servers._process import ServerProcess
from harness.servers._readiness import Readiness


class LaunchedTarget(Target):
    """A server started for the run as a child process group, with its log in the run folder.

    Subclasses give :meth:`build_argv`, ``log_name``, ``label`` and the log lines that mean the
    engine died (``DEAD_MARKERS``). ``config`` must have ``host``, ``port`` (0: a free port),
    ``startup_timeout_s`` and ``stop_grace_s``, and may have ``env`` (variables added to the
    server's); its kind's ``writes_tables`` says whether the engine writes its tables.
    """

    kind: ClassVar[str]
    label: ClassVar[str]
    log_name: ClassVar[str]
    DEAD_MARKERS: ClassVar[tuple[str, ...]] = ()
    config: Any  # a kind's options with the fields above; each subclass names its model
    cwd: Path | None = None
    """The working directory it starts in (``None``: the harness's)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.served_model_name = config.served_model_name
        self.port = config.port or free_port(config.host)
        self.base_url = f"http://{config.host}:{self.port}"
        self.server = ServerProcess(self.label)
        self.log_path: Path | None = None
        self.argv: list[str] = []
        self._log_offset = 0
        self._dead: str | None = None
        self.probe_loaded: bool = config.writes_tables
        """Whether the engine's table writer is loaded: the kind's ``writes_tables``, unless
        this target's options turn it off (vLLM's ``engine_probe = "off"``)."""
        self.probe_requested = "on" if config.writes_tables else "off"
        self.probe_note = "not started"
        self.readiness_result: str | None = None

    def build_argv(self) -> list[str]:
        raise NotImplementedError

    def processes(self) -> list[ServerProcess]:
        return [self.server]

    def ready_when(self) -> Readiness | None:
        """What must answer before the server counts as started (``None``, the default:
        ``GET /health`` answering 200); what answered is :attr:`readiness_result`."""
        return None

    def launch_env(self) -> dict[str, str]:
        """Environment variables added to the server's: the configuration's ``env`` over
        ``HF_HUB_OFFLINE=1`` (never reach out to a model hub: a model that is not on disk is an
        error)."""
        return {"HF_HUB_OFFLINE": "1", **getattr(self.config, "env", {})}

    def start(self, run_dir: Path) -> None:
        """Launch the server with :meth:`launch_env` and ``ZEROWINDOW_ENGINE_DIR`` set to the
        run folder (absolute), where an engine that writes its own tables (the emulator, vLLM
        with the engine probe) puts them; the run folder wins over a configured value. Once it
        answers, ``engine_dir`` is the run folder if :attr:`probe_loaded`."""
        self.argv = self.build_argv()
        self.log_path = run_dir / self.log_name
        env = {**self.launch_env(), ENGINE_DIR_ENV: str(run_dir.resolve())}
        try:
            self.readiness_result = self.server.launch(
                self.argv,
                log_path=self.log_path,
                url=self.base_url,
                timeout_s=self.config.startup_timeout_s,
                env=env,
                cwd=self.cwd,
                alive=self.failure,  # also sees death markers in the log
                readiness=self.ready_when(),
                model=self.served_model_name,
            )
        except TargetError as exc:
            raise TargetError(f"{exc}{self._last_error()}; see {self.log_path}") from None
        self.engine_dir = run_dir if self.probe_loaded else None

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

    def engine_probe(self) -> dict[str, Any]:
        """As for any target, with ``requested`` (the target's setting)."""
        return {"requested": self.probe_requested, **super().engine_probe()}

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "base_url": self.base_url,
            "argv": self.argv,
            "pid": self.server.proc.pid if self.server.proc else None,
        }
