"""Child processes owned by a run: started in their own session, stopped as a whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path


def start_process(
    argv: list[str], *, log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (so it has its own process group) with stdout and stderr
    appended to ``log_path``. Raises ``OSError`` if the program cannot be started."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,
        )


def stop_process_group(proc: subprocess.Popen[bytes], *, grace_s: float = 10.0) -> int | None:
    """Stop the process group led by ``proc``: SIGTERM, then SIGKILL after ``grace_s`` seconds.

    Children that outlive the leader are killed too. Returns the leader's exit code. Safe to
    call more than once.
    """

    def _signal(sig: int) -> bool:
        try:
            os.killpg(proc.pid, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    if proc.poll() is None:
        _signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # The leader may be gone while children of the group remain (vLLM's engine core).
    deadline = time.monotonic() + grace_s
    while _signal(0) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal(signal.SIGKILL)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        return None
