"""What the proxy kinds that run a third-party program (nginx, haproxy, envoy) share: typed
options as a strict pydantic model, a configuration file rendered into the run folder, the
binary looked up on PATH, one process group started, health-checked and stopped with the run.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any, ClassVar

from harness.servers._base import Proxy
from harness.servers._health import free_port
from harness.servers._process import ServerProcess
from harness.servers._readiness import HttpReadiness
from zwcore import TargetError


def duration_ms(seconds: float) -> str:
    """``seconds`` as a whole number of milliseconds with an ``ms`` suffix, at least 1 ms (the
    unit both nginx and haproxy accept in their time arguments)."""
    return f"{max(1, round(seconds * 1000))}ms"


def find_binary(name: str, *, hint: str) -> str:
    """The path of program ``name``: on PATH, else next to this interpreter (a program that a
    pip package installs into the virtual environment's ``bin``). Raises
    :class:`TargetError` with ``hint`` (how to install it) when there is none."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise TargetError(f"{name!r} is not on PATH ({hint})")
    return found


def split_upstream(upstream_url: str) -> tuple[str, int]:
    """(host, port) of ``http://host:port``. Raises :class:`TargetError` for anything else."""
    scheme, _, rest = upstream_url.partition("://")
    host, _, port = rest.rstrip("/").rpartition(":")
    if scheme != "http" or not host or not port.isdigit():
        raise TargetError(f"proxy upstream must be http://HOST:PORT, got {upstream_url!r}")
    return host.strip("[]"), int(port)


class ConfiguredProxy(Proxy):
    """A third-party proxy started for the run, its files in ``<run>/<kind>/``.

    Subclasses set ``kind``, ``label``, ``binary_hint`` and ``conf_name`` and implement
    :meth:`render` (the configuration text) and :meth:`build_argv`. ``config`` must have
    ``binary``, ``listen_host``, ``listen_port`` (0: a free port) and ``startup_timeout_s``.
    """

    kind: ClassVar[str]
    label: ClassVar[str]
    binary_hint: ClassVar[str]
    conf_name: ClassVar[str]
    log_name: ClassVar[str] = "stderr.log"
    ready_path: ClassVar[str | None] = None
    """A path of the proxy's own that answers 200 once it serves (``None``: ``GET /health``
    through it, answered by the target)."""

    def launch_env(self) -> dict[str, str]:
        """Variables added to the program's environment (default: none)."""
        return {}

    def __init__(self, config: Any) -> None:
        self.config = config
        self.port: int = config.listen_port or free_port(config.listen_host)
        self.server = ServerProcess(self.label)
        self.argv: list[str] = []
        self.folder: Path | None = None

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        """The configuration file's text: listen on ``config.listen_host:self.port``, proxy to
        the upstream, keep every file the program writes under ``folder``."""
        raise NotImplementedError

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        """The command line that runs the program in the foreground on ``conf``."""
        raise NotImplementedError

    def log_tail(self) -> str:
        """The end of the program's own log, for error messages ("" if none)."""
        if self.folder is None:
            return ""
        for name in ("error.log", self.log_name):
            path = self.folder / name
            if path.exists() and (text := path.read_text(errors="replace").strip()):
                return text[-400:]
        return ""

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Render the configuration into ``<run_dir>/<kind>/``, start the program and wait for
        ``/health`` through it; return the URL clients use. Raises :class:`TargetError`
        naming the program and quoting its log when it is missing, fails or stays unhealthy."""
        binary = find_binary(self.config.binary, hint=self.binary_hint)
        host, port = split_upstream(upstream_url)
        self.folder = (run_dir / self.kind).resolve()
        self.folder.mkdir(parents=True, exist_ok=True)
        conf = self.folder / self.conf_name
        conf.write_text(self.render(self.folder, host, port))
        self.argv = self.build_argv(binary, conf, self.folder)
        url = f"http://{self.config.listen_host}:{self.port}"
        try:
            self.server.launch(
                self.argv,
                log_path=self.folder / self.log_name,
                url=url,
                timeout_s=self.config.startup_timeout_s,
                env=self.launch_env(),
                readiness=HttpReadiness(path=self.ready_path) if self.ready_path else None,
            )
        except TargetError as exc:
            self.stop()
            raise TargetError(f"{self.label}: {exc}; {self.log_tail()}") from None
        return url

    def processes(self) -> list[ServerProcess]:
        return [self.server]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "argv": self.argv,
            "config": self.config.model_dump(mode="json"),
            "listen": f"{self.config.listen_host}:{self.port}",
            "config_file": str(self.folder / self.conf_name) if self.folder else None,
        }
