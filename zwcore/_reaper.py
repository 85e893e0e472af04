"""Nothing outlives the harness: a reaper process ends what the harness started once it is gone.

The first :func:`reap_on_exit` of a harness process starts one reaper (this file, run by path
with the standard library only: ``python -I -S zwcore/_reaper.py``) in a session of its own,
and keeps the write end of a pipe to its stdin. Each started process group is written down as a
line ``PID START_TICKS`` (its leader; the start time in clock ticks after boot, field 22 of
``/proc/PID/stat``, proc(5), so a reused pid is never taken for it). The pipe closes when the
harness ends, however it ends (SIGKILL, the OOM killer, a CI time limit included: the kernel
closes a dead process's descriptors; the reaper also checks every 0.5 s that the harness still
runs, for a child forked without exec that would hold the pipe open); the reaper then sends
SIGTERM to every member of a watched group still alive that started after its leader, waits up
to :data:`GRACE_S` and sends SIGKILL to what is left. A harness that ended normally has stopped
everything already and the reaper finds nothing.

The servers, Locust processes and the emulator are started in sessions of their own (so a
run stops each as a whole group), which is why ``PR_SET_PDEATHSIG`` (prctl(2)) alone would not
do: it is per process, cleared for the children a process forks, and fires when the thread
that forked exits, not the process. Network namespaces and qdiscs are not processes: ``zerowindow
netem clean`` removes what a dead run left of them.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time

GRACE_S = 2.0
"""How long the reaper waits between SIGTERM and SIGKILL (s)."""

_lock = threading.Lock()
_reaper: subprocess.Popen[bytes] | None = None
_owner_pid: int | None = None


def start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks after boot (proc(5), ``stat`` field
    22), or ``None`` if it is gone."""
    stat = _stat(pid)
    return None if stat is None else stat[1]


def _stat(pid: int) -> tuple[int, int] | None:
    """``(process group, start ticks)`` of ``pid`` from ``/proc/PID/stat``; ``None`` if gone
    or a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[1].split()  # after "(comm)", which may hold spaces
    if fields[0] == "Z":
        return None
    return int(fields[2]), int(fields[19])


def reap_on_exit(pid: int) -> None:
    """End the process group that ``pid`` leads when this process ends, if it still runs then
    (module docstring). Never raises: a reaper that cannot be
    started leaves the run as it was (the run's own clean-up and ``netem clean`` remain)."""
    global _reaper, _owner_pid
    ticks = start_ticks(pid)
    if ticks is None:
        return
    with _lock:
        try:
            if _reaper is None or _owner_pid != os.getpid() or _reaper.poll() is not None:
                me = os.getpid()
                _reaper = subprocess.Popen(
                    [sys.executable, "-I", "-S", os.path.abspath(__file__), str(me),
                     str(start_ticks(me))],
                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
                _owner_pid = me
            assert _reaper.stdin is not None
            _reaper.stdin.write(f"{pid} {ticks}\n".encode())
            _reaper.stdin.flush()
        except (OSError, ValueError):
            pass


def _targets(watched: dict[int, int]) -> list[int]:
    """The pids still alive of the groups ``watched`` names (leader pid -> its start ticks):
    members that started after their leader."""
    alive: list[int] = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        stat = _stat(pid)
        if stat is None:
            continue
        pgrp, ticks = stat
        if pgrp in watched and ticks >= watched[pgrp]:
            alive.append(pid)
    return alive


def reap(watched: dict[int, int], grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM what ``watched`` names and still runs, SIGKILL what is left after ``grace_s``
    seconds. Returns the pids signalled."""
    first = _targets(watched)
    for pid in first:
        _kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := _targets(watched)) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        _kill(pid, signal.SIGKILL)
    return sorted(set(first) | set(left))


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _main(owner: int, owner_ticks: int) -> None:
    """Read watch lines until the pipe closes or the owner process is gone (a child it forked
    without exec may hold the pipe open after it), then :func:`reap`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the harness's
    watched: dict[int, int] = {}  # group leader's pid -> its start ticks
    pending = b""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], 0.5)
        data = os.read(fd, 65536) if ready else None
        if data:
            pending += data
            *lines, pending = pending.split(b"\n")
            for line in lines:
                pid, ticks = line.split()
                watched[int(pid)] = int(ticks)
        elif data == b"" or start_ticks(owner) != owner_ticks:
            break
    reap(watched)


if __name__ == "__main__":
    _main(int(sys.argv[1]), int(sys.argv[2]))
