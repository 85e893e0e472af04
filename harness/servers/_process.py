"""Child processes owned by a run: started in their own session, stopped as a whole group."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from harness.servers._health import wait_healthy
from harness.servers._readiness import Readiness, wait_ready
from netem import exec_prefix
from zwcore import TargetError, reap_on_exit


def start_process(
    argv: list[str],
    *,
    log_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    netns: str | None = None,
    cpus: tuple[int, ...] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a new session (so it has its own process group) with stdout and stderr
    appended to ``log_path``, inside network namespace ``netns`` if given (through
    ``ip netns exec``, which then execs ``argv``: the pid is the program's), on the CPUs
    ``cpus`` if given: the calling thread takes the set while it starts the program, so the
    program is born with it (a new task copies its parent thread's CPU mask, sched(7)) and
    every process it forks inherits it; no ``preexec_fn``, which is unsafe in a process with
    threads. (Setting the set on the pid after the start left a child forked in between on the
    old set.) Raises ``OSError`` if the program cannot be started or pinned."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    own = os.sched_getaffinity(0) if cpus is not None else None
    try:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)  # this thread only, until the program started
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                exec_prefix(netns) + argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,
            )
    finally:
        if own is not None:
            os.sched_setaffinity(0, own)
    reap_on_exit(proc.pid)  # should the harness die without stopping it
    return proc


def stop_process_group(
    proc: subprocess.Popen[bytes], *, grace_s: float = 10.0, sig: int = signal.SIGTERM
) -> int | None:
    """Stop the process group led by ``proc``: ``sig`` (SIGTERM), then SIGKILL after ``grace_s``
    seconds.

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
        _signal(sig)
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


class ServerProcess:
    """A server the run starts (target or proxy): its process group, health check and exit.

    ``label`` names it in messages ("nginx", "vLLM"); ``netns``, when set before
    :meth:`launch`, is the network namespace it runs in.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        self.proc: subprocess.Popen[bytes] | None = None
        # The network namespace to start in (set by the run when it has a topology).
        self.netns: str | None = None
        # The CPUs to start on (set by the run's placement; None: the harness's own).
        self.cpus: tuple[int, ...] | None = None

    def launch(
        self,
        argv: list[str],
        *,
        log_path: Path,
        url: str,
        timeout_s: float,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        alive: Callable[[], str | None] | None = None,
        readiness: Readiness | None = None,
        model: str = "",
    ) -> str | None:
        """Start ``argv`` in ``cwd`` (see :func:`start_process`) and wait until it is ready:
        until ``readiness`` says so at ``url`` (for ``model``; see :func:`wait_ready`), else
        until ``{url}/health`` answers 200. ``alive`` reports an early death (default:
        :meth:`failure`). Returns what answered ``readiness`` (``None`` without one). Raises
        :class:`TargetError` if it cannot start, dies or stays unready."""
        try:
            self.proc = start_process(
                argv, log_path=log_path, env=env, cwd=cwd, netns=self.netns, cpus=self.cpus
            )
        except OSError as exc:
            raise TargetError(f"cannot start {self.label} ({argv[0]}): {exc}") from None
        alive = alive or self.failure
        if readiness is not None:
            return wait_ready(readiness, url, model=model, timeout_s=timeout_s, alive=alive)
        wait_healthy(url, timeout_s=timeout_s, alive=alive)
        return None

    def failure(self) -> str | None:
        """``None`` while the process runs, else why it does not."""
        if self.proc is None:
            return "not started"
        code = self.proc.poll()
        return None if code is None else f"{self.label} exited with code {code}"

    def stop(self, *, grace_s: float, sig: int = signal.SIGTERM) -> None:
        """Stop the process group with ``sig``, then SIGKILL after ``grace_s`` (see
        :func:`stop_process_group`); safe to call twice."""
        if self.proc is not None:
            stop_process_group(self.proc, grace_s=grace_s, sig=sig)
