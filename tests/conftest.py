"""Shared fixtures: the tiny model and one real vLLM server for the whole test session."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Pin the CPU worker to core 0 so the API server and the load generator keep a core.
VLLM_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0"}
ZEROWINDOW = [sys.executable, "-m", "harness"]
# The KV budget of the shared server: 64 blocks of 32 tokens, as in DESIGN.md's measurement.
VLLM_ARGS = [
    "--num-gpu-blocks-override", "64", "--block-size", "32", "--max-num-seqs", "16",
    "--max-model-len", "1024", "--gpu-memory-utilization", "0.1",
]  # fmt: skip


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Stop the session if a test loaded Locust into this process: gevent's monkey-patching
    would turn every later test's threads (emulator, egress buffer, samplers) into greenlets
    that block each other, and the suite would hang instead of failing. Load belongs in Locust
    subprocesses."""
    if "locust" in sys.modules or "gevent.monkey" in sys.modules:
        pytest.exit(f"{item.nodeid} imported Locust/gevent into the pytest process", returncode=3)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model `make` generated, or a fresh one in a temporary folder."""
    made = REPO / "models" / "tiny"
    if (made / "config.json").exists():
        return made
    from harness.servers._tiny_model import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)


@pytest.fixture(scope="session")
def vllm_server(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL of one real vLLM server (CPU build) shared by the session's integration tests,
    with the engine probe writing into a temporary folder (:func:`vllm_engine_dir`)."""
    if not vllm_available():
        pytest.skip("vLLM is not installed (make test installs vllm-cpu)")
    from harness.servers import VllmTargetConfig
    from harness.servers._vllm import VllmTarget

    log_dir = tmp_path_factory.mktemp("vllm")
    target = VllmTarget(
        VllmTargetConfig(
            kind="vllm",
            model=str(tiny_model),
            served_model_name="tiny",
            extra_args=VLLM_ARGS,
            env=VLLM_ENV,
        )
    )
    try:
        target.start(log_dir)
    except Exception:
        target.stop()
        log = log_dir / "vllm.log"
        print(log.read_text()[-5000:] if log.exists() else "no vllm.log", file=sys.stderr)
        raise
    VLLM_ENGINE_DIRS.append(log_dir)
    yield target.base_url
    target.stop()


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
