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


def host_facts() -> dict[str, Any]:
    """Hostname, CPU count, memory (bytes, from /proc/meminfo) and the interpreter path."""
    mem_bytes = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    mem_bytes = int(line.split()[1]) * 1024
    except OSError:
        pass
    return {
        "hostname": socket.gethostname(),
        "cpus": os.cpu_count(),
        "memory_bytes": mem_bytes,
        "platform": platform.platform(),
        "python_executable": sys.executable,
    }
