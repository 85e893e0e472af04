"""Build llama.cpp's ``llama-server`` from the llama.cpp that PyPI's llama-cpp-python sdist
vendors, once, into a per-user cache.

The toolkit starts ``llama-server`` (llama.cpp's C++ OpenAI-compatible server) as a target
under test. It is built from source on this machine: :func:`build_llama_server` downloads the
llama-cpp-python sdist of :data:`LLAMA_CPP_PYTHON_VERSION` with pip, configures its
``vendor/llama.cpp`` with CMake and builds only the ``llama-server`` target with Ninja (a static,
one-file binary; no embedded web UI, no HTTPS, no tests or examples), then moves the result into
``cache_dir()/llama-server-<version>/`` in one rename, so a half-built binary never looks cached.
A second call finds the cached binary and returns at once. :func:`find_llama_server` finds a
binary without building one.

The build runs the web UI out (``LLAMA_BUILD_UI=OFF``, ``LLAMA_USE_PREBUILT_UI=OFF``, which
also keeps CMake from downloading the prebuilt UI), so start the server with ``--no-ui``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
"""The llama-cpp-python sdist whose vendored llama.cpp is built: the same version as the Python
engine, so that both engines run the same llama.cpp."""

CACHE_ENV = "ZEROWINDOW_CACHE"
"""Environment variable naming the toolkit's cache folder (see :func:`cache_dir`)."""

LLAMA_SERVER_ENV = "ZEROWINDOW_LLAMA_SERVER"
"""Environment variable naming a ``llama-server`` executable to use instead of the cached one."""

CMAKE_OPTIONS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",  # one self-contained file (system libc/libstdc++/libgomp aside)
    "-DGGML_NATIVE=ON",  # tuned for this machine's CPU: the cache is per machine
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",  # tools/server lives under tools/
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",  # no npm build of the web UI
    "-DLLAMA_USE_PREBUILT_UI=OFF",  # no download of the prebuilt web UI
    "-DLLAMA_OPENSSL=OFF",  # no HTTPS (model download from hubs): no libssl at run time
)
"""The options ``cmake`` configures vendor/llama.cpp with (LLAMA_CURL is gone in this llama.cpp:
it only warns that it is ignored)."""

_TAIL_LINES = 20
_DEBIAN_PACKAGES = {"cmake": "cmake", "ninja": "ninja-build"}


def cache_dir() -> Path:
    """The toolkit's cache folder: ``$ZEROWINDOW_CACHE`` if set, else
    ``${XDG_CACHE_HOME:-~/.cache}/zerowindow``. Not created here."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "zerowindow"


def cached_llama_server() -> Path:
    """Where :func:`build_llama_server` puts the binary:
    ``cache_dir()/llama-server-<LLAMA_CPP_PYTHON_VERSION>/bin/llama-server`` (it may not exist)."""
    return _install_dir() / "bin" / "llama-server"


def find_llama_server() -> Path | None:
    """The ``llama-server`` executable to run, without building one: ``$ZEROWINDOW_LLAMA_SERVER``
    if set, else the cached build (:func:`cached_llama_server`), else ``llama-server`` on
    ``$PATH``; None when there is none.

    Raises RuntimeError when ``$ZEROWINDOW_LLAMA_SERVER`` is set but does not name an
    executable file (an explicit choice is not silently replaced by another binary)."""
    explicit = os.environ.get(LLAMA_SERVER_ENV)
    if explicit:
        path = Path(explicit).expanduser()
        if not _is_executable(path):
            raise RuntimeError(
                f"${LLAMA_SERVER_ENV}={explicit} is not an executable file "
                "(unset it to use the cached build or llama-server on $PATH)"
            )
        return path
    cached = cached_llama_server()
    if _is_executable(cached):
        return cached
    found = shutil.which("llama-server")
    return Path(found) if found else None


def build_llama_server(*, jobs: int | None = None, log: Callable[[str], None] = print) -> Path:
    """Build ``llama-server`` from the vendored llama.cpp of llama-cpp-python
    :data:`LLAMA_CPP_PYTHON_VERSION` and return the path of the cached binary
    (:func:`cached_llama_server`); return it at once, running nothing, when it is already there.

    Steps, each logged in one line through ``log``: download the sdist with pip (pip's cache
    makes a second download free; about 76 MB), extract its ``vendor/llama.cpp``, configure it
    with CMake (:data:`CMAKE_OPTIONS`) and build the ``llama-server`` target with Ninja using
    ``jobs`` parallel compilers (default: the number of CPUs; about 11 minutes on 2 CPUs), run
    ``llama-server --version``, then move the binary and a ``build.json`` (versions, CMake
    options, jobs, seconds taken, UTC date) into ``cache_dir()/llama-server-<version>/`` with one
    rename. The temporary folders are removed on success, on error and on Ctrl-C; a build that
    stopped half-way leaves nothing that looks cached.

    Raises RuntimeError naming the step that failed, its command and the last 20 lines of its
    output; when ``cmake`` or ``ninja`` is missing, it names the Debian package to install
    (cmake, ninja-build). Raises OSError when the cache folder cannot be written."""
    target = cached_llama_server()
    if _is_executable(target):
        log(f"llama-server: cached build {target}")
        return target
    tools = {name: _require_tool(name) for name in ("cmake", "ninja")}
    jobs = jobs if jobs is not None else (os.cpu_count() or 1)
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")

    started = time.monotonic()
    install = _install_dir()
    install.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f"zerowindow-llama-server-{LLAMA_CPP_PYTHON_VERSION}-"))
    # the staging folder sits beside the final one so that the last step is one rename
    stage = Path(tempfile.mkdtemp(prefix=f".{install.name}.", suffix=".tmp", dir=install.parent))
    try:
        sdist = _download_sdist(work / "sdist", log)
        source = _extract_llama_cpp(sdist, work / "src", log)
        build = work / "build"
        configure = [tools["cmake"], "-S", str(source), "-B", str(build), "-G", "Ninja"]
        log(f"llama-server: configure (cmake) in {build}")
        _run_step("configure", [*configure, *CMAKE_OPTIONS])
        log(f"llama-server: build (ninja -j {jobs}, about 11 minutes on 2 CPUs)")
        _run_step("build", [tools["ninja"], "-C", str(build), "-j", str(jobs), "llama-server"])
        built = build / "bin" / "llama-server"
        if not _is_executable(built):
            raise RuntimeError(f"llama-server build: step 'build' made no executable {built}")
        (stage / "bin").mkdir()
        binary = stage / "bin" / "llama-server"
        shutil.copy2(built, binary)
        for lib in sorted((build / "bin").glob("lib*.so*")):  # none in a static build
            shutil.copy2(lib, stage / "bin" / lib.name, follow_symlinks=False)
        log("llama-server: check (llama-server --version)")
        version = _run_step("check", [str(binary), "--version"], timeout=60)
        record = {
            "llama_cpp_python_version": LLAMA_CPP_PYTHON_VERSION,
            "llama_server_version": [line for line in version if line.strip()],
            "cmake_options": list(CMAKE_OPTIONS),
            "jobs": jobs,
            "seconds": round(time.monotonic() - started, 1),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        }
        (stage / "build.json").write_text(json.dumps(record, indent=2) + "\n")
        _install(stage, install)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(stage, ignore_errors=True)
    log(f"llama-server: built {target} in {time.monotonic() - started:.0f} s")
    return target


def _install_dir() -> Path:
    return cache_dir() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _require_tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(
            f"llama-server build needs {name}, which is not on $PATH "
            f"(Debian: apt-get install {_DEBIAN_PACKAGES[name]})"
        )
    return found


def _download_sdist(dest: Path, log: Callable[[str], None]) -> Path:
    spec = f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"
    log(f"llama-server: download the {spec} sdist (pip download) into {dest}")
    # `--no-binary llama-cpp-python`, not `:all:`: the sdist all the same, but pip may take the
    # sdist's build requirements (it prepares its metadata) as wheels: 15 s instead of 2 min
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary"]
    cmd += ["llama-cpp-python", spec, "-d", str(dest)]
    _run_step("download", cmd)
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if len(found) != 1:
        raise RuntimeError(
            f"llama-server build: step 'download' left {[p.name for p in found]} in {dest}, "
            "not one llama_cpp_python-*.tar.gz"
        )
    return found[0]


def _extract_llama_cpp(sdist: Path, dest: Path, log: Callable[[str], None]) -> Path:
    log(f"llama-server: extract vendor/llama.cpp from {sdist.name}")
    try:
        with tarfile.open(sdist) as tar:
            top = tar.getnames()[0].split("/", 1)[0]
            prefix = f"{top}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            if not members:
                raise RuntimeError(f"llama-server build: step 'extract': no {prefix} in {sdist}")
            tar.extractall(dest, members=members, filter="data")
    except (OSError, tarfile.TarError) as exc:
        raise RuntimeError(f"llama-server build: step 'extract' of {sdist}: {exc}") from exc
    return dest / prefix.rstrip("/")


def _run_step(step: str, cmd: Sequence[str], *, timeout: float | None = None) -> list[str]:
    """Run ``cmd`` in its own process group, wait for it (at most ``timeout`` seconds) and
    return the last 20 lines of its output (stdout and stderr together). Raise RuntimeError
    naming the step and the command, with those lines, when it cannot start, fails or times
    out. On Ctrl-C or any other exception the whole group (e.g. ninja's compilers) is ended."""
    command = shlex.join(cmd)
    try:
        proc = subprocess.Popen(
            list(cmd),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
        )
    except OSError as exc:
        raise RuntimeError(
            f"llama-server build: step '{step}' could not start\ncommand: {command}\n{exc}"
        ) from exc
    tail: deque[str] = deque(maxlen=_TAIL_LINES)
    problem = None
    try:
        if timeout is None:
            assert proc.stdout is not None
            for line in proc.stdout:
                tail.append(line.rstrip("\n"))
            rc = proc.wait()
        else:
            try:
                out, _ = proc.communicate(timeout=timeout)
                tail.extend(out.splitlines())
                rc = proc.returncode
            except subprocess.TimeoutExpired:
                _end_group(proc)
                rc = proc.returncode
                problem = f"did not end within {timeout:g} s"
    except BaseException:
        _end_group(proc)
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    if problem is None and rc != 0:
        problem = f"failed (exit code {rc})"
    if problem is not None:
        shown = "\n".join(f"  {line}" for line in tail) or "  (no output)"
        raise RuntimeError(
            f"llama-server build: step '{step}' {problem}\n"
            f"command: {command}\nlast {len(tail)} lines of its output:\n{shown}"
        )
    return list(tail)


def _end_group(proc: subprocess.Popen[str]) -> None:
    """End the process group that ``proc`` leads: SIGTERM, then SIGKILL after 10 s."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _install(stage: Path, install: Path) -> None:
    """Rename ``stage`` to ``install``; a folder already there without an executable (left by
    hand) is replaced, one with an executable (another build that finished first) is kept."""
    stage.chmod(0o755)  # mkdtemp makes it 0700
    try:
        stage.rename(install)
        return
    except OSError:
        if not install.is_dir():
            raise
        if _is_executable(install / "bin" / "llama-server"):
            return
    shutil.rmtree(install)
    stage.rename(install)
