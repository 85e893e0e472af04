"""Shared fixtures: the tiny model and one real vLLM server for the whole test session."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.servers._vllm import SUITE_ARGS
from tests.otlp_receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[1]
# Pin the CPU worker to core 0 so the API server and the load generator keep a core.
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0"}
ZEROWINDOW = [sys.executable, "-m", "harness"]
# The shared server is the suite's vLLM (`suite run --target vllm`): 64 blocks of 32 tokens, as
# in DESIGN.md's measurement.
VLLM_ARGS = SUITE_ARGS
# The shared server exports its own spans (vLLM's `llm_request`, one per finished request) to
# this receiver, over OTLP/HTTP (vLLM's default is gRPC: vllm/tracing/otel.py), every 0.2 s.
VLLM_OTLP = OtlpReceiver()
VLLM_OTLP_ENV = {
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
    "OTEL_BSP_SCHEDULE_DELAY": "200",
}


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop the session if a test loaded Locust into this process: gevent's monkey-patching
    would turn every later test's threads (emulator, egress buffer, samplers) into greenlets
    that block each other, and the suite would hang instead of failing. Load belongs in Locust
    subprocesses."""
    if "locust" in sys.modules or "gevent.monkey" in sys.modules:
        pytest.exit(f"{item.nodeid} imported Locust/gevent into the pytest process", returncode=3)


def vllm_available() -> bool:
    """Whether vLLM is installed, without importing it (vLLM and torch take seconds and half a
    gigabyte to import, which this process never needs: the servers import them)."""
    return importlib.util.find_spec("vllm") is not None


def _tiny_model(factory: pytest.TempPathFactory) -> Path:
    made = REPO / "models" / "tiny"
    if (made / "config.json").exists():
        return made
    from harness.servers._tiny_model import make_tiny_model

    return make_tiny_model(factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model `make` generated, or a fresh one in a temporary folder."""
    return _tiny_model(tmp_path_factory)


class _SharedVllm:
    """The session's one vLLM server, started in a thread as soon as the collected tests are
    known to need it: its ~35 s of start-up (three processes importing torch and vLLM, then
    compiling the model) overlap the tests that run before the first one that uses it."""

    def __init__(self) -> None:
        self.target: Any = None
        self.log_dir: Path | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    def start(self, factory: pytest.TempPathFactory) -> None:
        self.log_dir = factory.mktemp("vllm")
        self.thread = threading.Thread(target=self._run, args=(factory,), daemon=True)
        self.thread.start()

    def _run(self, factory: pytest.TempPathFactory) -> None:
        try:
            from harness.servers import VllmTargetConfig
            from harness.servers._vllm import VllmTarget

            config = VllmTargetConfig(
                kind="vllm", model=str(_tiny_model(factory)), served_model_name="tiny",
                extra_args=[*VLLM_ARGS, "--otlp-traces-endpoint", VLLM_OTLP.url],
                env={**VLLM_ENV, **VLLM_OTLP_ENV},
            )  # fmt: skip
            self.target = VllmTarget(config)
            assert self.log_dir is not None
            self.target.start(self.log_dir)
        except BaseException as exc:  # raised again in the test that asks for the server
            self.error = exc

    def wait(self) -> str:
        """The server's base URL once it answers; raises what its start raised."""
        assert self.thread is not None and self.log_dir is not None
        self.thread.join()
        if self.error is not None:
            log = self.log_dir / "vllm.log"
            print(log.read_text()[-5000:] if log.exists() else "no vllm.log", file=sys.stderr)
            raise self.error
        return str(self.target.base_url)

    def stop(self) -> None:
        if self.thread is not None:
            self.thread.join()
        if self.target is not None:
            self.target.stop()
            self.target = None


_SHARED_VLLM = _SharedVllm()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the shared vLLM server now if a collected test will ask for it (and vLLM is
    installed; without it that test skips)."""
    if session.config.option.collectonly:
        return
    wanted = any("vllm_server" in getattr(item, "fixturenames", ()) for item in session.items)
    if wanted and vllm_available():
        VLLM_OTLP.start()  # before the server, which is given its port
        _SHARED_VLLM.start(session.config._tmp_path_factory)  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    _SHARED_VLLM.stop()
    VLLM_OTLP.stop()


@pytest.fixture(scope="session")
def vllm_server() -> Iterator[str]:
    """Base URL of one real vLLM server (CPU build) shared by the session's integration tests,
    with the engine probe writing into a temporary folder (:func:`vllm_engine_dir`)."""
    if not vllm_available() or _SHARED_VLLM.thread is None:
        pytest.skip("vLLM is not installed (make test installs vllm-cpu)")
    url = _SHARED_VLLM.wait()
    assert _SHARED_VLLM.log_dir is not None
    VLLM_ENGINE_DIRS.append(_SHARED_VLLM.log_dir)
    yield url
    _SHARED_VLLM.stop()


@pytest.fixture(scope="session")
def vllm_otlp(vllm_server: str) -> OtlpReceiver:
    """The OTLP receiver the shared vLLM server exports its spans to."""
    return VLLM_OTLP


VLLM_ENGINE_DIRS: list[Path] = []  # where the shared server's engine probe writes its tables


@pytest.fixture(scope="session")
def vllm_engine_dir(vllm_server: str) -> Path:
    """The folder where the shared vLLM server's engine probe writes its tables (a ``url``
    target's ``engine_dir``)."""
    return VLLM_ENGINE_DIRS[-1]


def run_cli(*args: str, timeout: float = 600, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """Run ``zerowindow ARGS`` from the repository's folder and capture its output: in this
    process, through the command's own entry (``harness.cli.app``, typer's test runner: what a
    second interpreter would run, without its second of imports), or in a process of its own
    when the call gives one its environment (``env=``). An exception the command does not turn
    into an exit code is raised, as it would end a process with a traceback."""
    if kwargs:
        return subprocess.run(
            [*ZEROWINDOW, *args], capture_output=True, text=True, timeout=timeout, cwd=REPO,
            **kwargs,
        )  # type: ignore[call-overload]  # fmt: skip
    from typer.testing import CliRunner

    from harness.cli import app

    with contextlib.chdir(REPO):
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return subprocess.CompletedProcess(
        [*ZEROWINDOW, *args], result.exit_code, result.stdout, result.stderr
    )


def only_run_dir(out: Path) -> Path:
    """The single run folder under ``out``."""
    dirs = [p for p in out.glob("*/*") if p.is_dir()]
    assert len(dirs) == 1, dirs
    return dirs[0]
