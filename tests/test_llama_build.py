"""``harness.servers._llama_build`` without a real build: where the binary is looked for, that a
cached build is returned without running anything, and that a failing step (pip, cmake, ninja
replaced by small shell scripts) raises a RuntimeError that names the step and leaves neither
temporary folders nor anything that looks cached."""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from harness.servers import _llama_build as lb

REAL_POPEN = subprocess.Popen
VERSION = lb.LLAMA_CPP_PYTHON_VERSION


def _executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder, no $ZEROWINDOW_LLAMA_SERVER, nothing on $PATH, and a private
    temporary folder (to check that a build leaves nothing in it)."""
    monkeypatch.setenv("ZEROWINDOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("ZEROWINDOW_LLAMA_SERVER", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(lb.tempfile, "tempdir", str(tmp_path / "tmp"))
    return tmp_path / "cache"


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("ZEROWINDOW_CACHE", str(tmp_path / "zw"))
    assert lb.cache_dir() == tmp_path / "zw"
    monkeypatch.delenv("ZEROWINDOW_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert lb.cache_dir() == tmp_path / "xdg" / "zerowindow"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert lb.cache_dir() == tmp_path / "home" / ".cache" / "zerowindow"
    assert (
        lb.cached_llama_server()
        == (tmp_path / "home" / ".cache" / "zerowindow" / f"llama-server-{VERSION}" / "bin")
        / "llama-server"
    )


def test_find_prefers_the_env_var(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mine = _executable(tmp_path / "mine" / "llama-server")
    _executable(lb.cached_llama_server())
    monkeypatch.setenv("ZEROWINDOW_LLAMA_SERVER", str(mine))
    assert lb.find_llama_server() == mine


def test_find_rejects_a_non_executable_env_var(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = tmp_path / "llama-server"
    plain.write_text("not a program")
    _executable(lb.cached_llama_server())
    monkeypatch.setenv("ZEROWINDOW_LLAMA_SERVER", str(plain))
    with pytest.raises(RuntimeError, match="ZEROWINDOW_LLAMA_SERVER.*not an executable"):
        lb.find_llama_server()
    monkeypatch.setenv("ZEROWINDOW_LLAMA_SERVER", str(tmp_path / "missing"))
    with pytest.raises(RuntimeError, match="not an executable"):
        lb.find_llama_server()


def test_find_uses_the_cache_then_path(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert lb.find_llama_server() is None
    on_path = _executable(tmp_path / "on-path" / "llama-server")
    monkeypatch.setenv("PATH", str(on_path.parent))
    assert lb.find_llama_server() == on_path
    cached = _executable(lb.cached_llama_server())
    assert cached == cache / f"llama-server-{VERSION}" / "bin" / "llama-server"
    assert lb.find_llama_server() == cached
    cached.chmod(0o644)  # not executable: not a build to run
    assert lb.find_llama_server() == on_path


def _refuse(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError(f"ran {args} {kwargs}")


def test_build_returns_the_cached_binary_without_running_anything(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cached = _executable(lb.cached_llama_server())
    monkeypatch.setattr(lb.subprocess, "Popen", _refuse)
    monkeypatch.setattr(lb.subprocess, "run", _refuse)
    monkeypatch.setattr(lb.tempfile, "mkdtemp", _refuse)
    logged: list[str] = []
    assert lb.build_llama_server(log=logged.append) == cached
    assert logged == [f"llama-server: cached build {cached}"]


def _sdist(path: Path) -> Path:
    """A small stand-in for the llama-cpp-python sdist: a top folder with vendor/llama.cpp."""
    with tarfile.open(path, "w:gz") as tar:
        for name in ("vendor/llama.cpp/CMakeLists.txt", "llama_cpp/__init__.py"):
            data = b"# stand-in\n"
            info = tarfile.TarInfo(f"llama_cpp_python-{VERSION}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


class FakeTools:
    """Replaces ``subprocess.Popen`` for the build's commands with small shell scripts: pip
    copies a stand-in sdist, cmake prints lines, ninja writes a llama-server script; ``fail``
    names the step whose command exits 3 after printing 30 numbered lines."""

    def __init__(self, tmp_path: Path, fail: str | None = None) -> None:
        self.sdist = _sdist(tmp_path / f"llama_cpp_python-{VERSION}.tar.gz")
        self.fail = fail
        self.calls: list[list[str]] = []

    def __call__(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[str]:
        cmd = list(cmd)
        self.calls.append(cmd)
        if "pip" in cmd:
            dest = cmd[cmd.index("-d") + 1]
            step, script = "download", f'mkdir -p "{dest}" && cp "{self.sdist}" "{dest}/"'
        elif Path(cmd[0]).name == "cmake":
            assert "-DBUILD_SHARED_LIBS=OFF" in cmd and "-DLLAMA_BUILD_UI=OFF" in cmd
            assert Path(cmd[cmd.index("-S") + 1], "CMakeLists.txt").is_file()
            step, script = "configure", "echo configured"
        elif Path(cmd[0]).name == "ninja":
            assert cmd[-1] == "llama-server"
            binary = Path(cmd[cmd.index("-C") + 1], "bin", "llama-server")
            step, script = (
                "build",
                (
                    f'mkdir -p "{binary.parent}" && '
                    f"printf '#!/bin/sh\\necho version: 1 fake\\n' > \"{binary}\" && "
                    f'chmod 755 "{binary}"'
                ),
            )
        else:
            return REAL_POPEN(cmd, **kwargs)  # the check step runs the fake binary
        if step == self.fail:
            script = "for i in $(seq 1 30); do echo line$i; done; exit 3"
        return REAL_POPEN(["/bin/sh", "-c", script], **kwargs, env={"PATH": "/usr/bin:/bin"})


@pytest.fixture
def tools(monkeypatch: pytest.MonkeyPatch) -> None:
    """cmake and ninja "found" (FakeTools replaces what they would run)."""
    monkeypatch.setattr(lb.shutil, "which", lambda name: f"/usr/bin/{name}")


def _leftovers(tmp_path: Path, cache: Path) -> list[str]:
    files = list((tmp_path / "tmp").iterdir())
    if cache.exists():
        files += [p for p in cache.iterdir() if p.name != f"llama-server-{VERSION}"]
    return [p.name for p in files]


def test_a_build_with_fake_tools_installs_the_binary_and_build_json(
    cache: Path, tmp_path: Path, tools: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeTools(tmp_path)
    monkeypatch.setattr(lb.subprocess, "Popen", fake)
    logged: list[str] = []
    path = lb.build_llama_server(jobs=3, log=logged.append)
    assert path == lb.cached_llama_server() and path.is_file()
    record = json.loads((path.parent.parent / "build.json").read_text())
    assert record["llama_cpp_python_version"] == VERSION
    assert record["llama_server_version"] == ["version: 1 fake"]
    assert record["cmake_options"] == list(lb.CMAKE_OPTIONS) and record["jobs"] == 3
    assert record["seconds"] >= 0 and record["date"].endswith("+00:00")
    (ninja,) = [c for c in fake.calls if c[0] == "/usr/bin/ninja"]
    assert ninja[ninja.index("-j") + 1] == "3"
    assert _leftovers(tmp_path, cache) == []
    assert all(line.startswith("llama-server: ") and "\n" not in line for line in logged)
    assert len(logged) == 6  # download, extract, configure, build, check, built
    monkeypatch.setattr(lb.subprocess, "Popen", _refuse)
    assert lb.build_llama_server(log=logged.append) == path


@pytest.mark.parametrize(
    ("step", "command"),
    [("download", "-m pip download"), ("configure", "cmake -S"), ("build", "ninja -C")],
)
def test_a_failing_step_raises_a_runtime_error_naming_it(
    cache: Path,
    tmp_path: Path,
    tools: None,
    monkeypatch: pytest.MonkeyPatch,
    step: str,
    command: str,
) -> None:
    monkeypatch.setattr(lb.subprocess, "Popen", FakeTools(tmp_path, fail=step))
    with pytest.raises(RuntimeError) as info:
        lb.build_llama_server(log=lambda line: None)
    text = str(info.value)
    assert f"step '{step}' failed (exit code 3)" in text
    assert command in text.splitlines()[1]
    assert "last 20 lines" in text and "line30" in text and "line11" in text
    assert "line10" not in text
    assert not lb.cached_llama_server().exists()
    assert _leftovers(tmp_path, cache) == []


def test_missing_cmake_or_ninja_names_the_debian_package(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lb.subprocess, "Popen", _refuse)
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="needs cmake.*apt-get install cmake"):
        lb.build_llama_server(log=lambda line: None)
    monkeypatch.setattr(lb.shutil, "which", lambda name: None if name == "ninja" else name)
    with pytest.raises(RuntimeError, match="needs ninja.*apt-get install ninja-build"):
        lb.build_llama_server(log=lambda line: None)


def test_ctrl_c_leaves_no_temporary_folder(
    cache: Path, tmp_path: Path, tools: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lb.subprocess, "Popen", FakeTools(tmp_path))

    def interrupted(*args: Any) -> Path:
        raise KeyboardInterrupt

    monkeypatch.setattr(lb, "_extract_llama_cpp", interrupted)
    with pytest.raises(KeyboardInterrupt):
        lb.build_llama_server(log=lambda line: None)
    assert _leftovers(tmp_path, cache) == []
    assert not lb.cached_llama_server().exists()


def _gone(pid: int) -> bool:
    """True when ``pid`` has ended (absent, or a zombie nobody has reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def test_a_step_interrupted_ends_its_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C while a step runs ends the step's whole process group (as ninja's compilers),
    not only the process it started."""
    seen: list[str] = []

    class Interrupting(list[str]):
        def append(self, line: str) -> None:
            seen.append(line)
            raise KeyboardInterrupt

    monkeypatch.setattr(lb, "deque", lambda *args, **kwargs: Interrupting())
    with pytest.raises(KeyboardInterrupt):
        lb._run_step("build", ["sh", "-c", "sleep 60 & echo $!; wait"])
    child = int(seen[0])
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)


def test_a_check_step_that_hangs_times_out() -> None:
    with pytest.raises(RuntimeError, match=r"step 'check' did not end within 0.5 s"):
        lb._run_step("check", ["sh", "-c", "echo hanging; sleep 30"], timeout=0.5)


def test_cli_prints_the_cached_binary_and_turns_a_failure_into_exit_2(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from typer.testing import CliRunner

    from harness.cli import app

    monkeypatch.setattr(lb.subprocess, "Popen", _refuse)
    monkeypatch.setattr(lb.shutil, "which", lambda name: None)
    result = CliRunner().invoke(app, ["engine", "build", "llama-server", "--jobs", "1"])
    assert result.exit_code == 2, result.output
    assert "cannot build llama-server" in result.output
    assert "apt-get install cmake" in result.output and "Traceback" not in result.output
    cached = _executable(lb.cached_llama_server())
    result = CliRunner().invoke(app, ["engine", "build", "llama-server"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == str(cached)
