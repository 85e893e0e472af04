"""Facts for ``run.json`` and ``plan.json``: versions of the toolkit, its stack and the target's
engine, and the host."""

from __future__ import annotations

import os
import platform
import socket
import sys
from typing import Any

from harness.servers import Target, package_version
from netem import process_start_ticks


def versions(target: Target) -> dict[str, str | None]:
    """The toolkit's own versions (zerowindow, Locust, Python, the kernel) and those of the
    engine the run's ``target`` runs, as its kind reports them
    (:meth:`~harness.servers.Target.versions`: vLLM and torch, llama-cpp-python, llama-server's
    build, the emulator's; a name of the toolkit's own is never replaced). ``None``: not
    installed, or not found."""
    own: dict[str, str | None] = {
        "zerowindow": package_version("zerowindow"),
        "locust": package_version("locust"),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }
    return {**own, **{name: v for name, v in target.versions().items() if name not in own}}


def harness_process() -> dict[str, int | None]:
    """This process: its pid and start time (clock ticks after boot, proc(5)), so that
    ``zerowindow analyze`` can tell a run still going from one whose harness was killed."""
    pid = os.getpid()
    return {"pid": pid, "start_ticks": process_start_ticks(pid)}


def _first_field(path: str, key: str) -> str | None:
    """The value of the first ``key: value`` line of ``path`` (a /proc file), or ``None``."""
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(":")
                if name.strip() == key:
                    return value.strip()
    except OSError:
        pass
    return None


def host_facts() -> dict[str, Any]:
    """Hostname, CPU model (``model name`` of /proc/cpuinfo) and count, memory (bytes, from
    /proc/meminfo) and the interpreter path."""
    mem = _first_field("/proc/meminfo", "MemTotal")
    return {
        "hostname": socket.gethostname(),
        "cpu_model": _first_field("/proc/cpuinfo", "model name"),
        "cpus": os.cpu_count(),
        "memory_bytes": int(mem.split()[0]) * 1024 if mem else None,
        "platform": platform.platform(),
        "python_executable": sys.executable,
    }


# The CI's commit, run and ref as the usual variables give them: GitHub Actions
# (docs.github.com, "Variables reference"), GitLab CI ("Predefined CI/CD variables"), and
# Buildkite, Jenkins and CircleCI for the commit.
_CI_VARIABLES = {
    "commit": ("GITHUB_SHA", "CI_COMMIT_SHA", "BUILDKITE_COMMIT", "GIT_COMMIT", "CIRCLE_SHA1"),
    "run_id": ("GITHUB_RUN_ID", "CI_PIPELINE_ID", "BUILDKITE_BUILD_ID", "BUILD_ID",
               "CIRCLE_WORKFLOW_ID"),
    "ref": ("GITHUB_REF_NAME", "CI_COMMIT_REF_NAME", "BUILDKITE_BRANCH", "GIT_BRANCH",
            "CIRCLE_BRANCH"),
    "repository": ("GITHUB_REPOSITORY", "CI_PROJECT_PATH", "BUILDKITE_REPO"),
}  # fmt: skip


def ci_facts(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The CI's ``commit``, ``run_id``, ``ref`` and ``repository`` from the first of the usual
    variables set in ``environ`` (default: this process's environment); only those set, so
    ``{}`` outside CI."""
    env = os.environ if environ is None else environ
    found = {k: next((env[v] for v in names if env.get(v)), None) for k, names in
             _CI_VARIABLES.items()}  # fmt: skip
    return {k: v for k, v in found.items() if v}
