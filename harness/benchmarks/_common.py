"""What every benchmark needs: its error, percentiles, CPU placement, the child processes it
starts (and always stops), per-process CPU traces, the machine it ran on, JSON without NaN."""

from __future__ import annotations

import math
import os
import platform
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from zwcore import ZerowindowError

CLK_TCK = os.sysconf("SC_CLK_TCK")


class BenchError(ZerowindowError):
    """A benchmark cannot run (a tool is missing, a process failed): one line for a person."""


class BenchInterrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived during a benchmark."""


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile of ``values`` (linear interpolation); NaN when empty."""
    if not values:
        return math.nan
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def ratio(a: float | None, b: float | None) -> float | None:
    """``a / b``, or None when either is missing, not finite, or ``b`` is 0."""
    if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
        return None
    return a / b


def us_per_event(cpu_s: float, events: int) -> float:
    """CPU µs per event of ``cpu_s`` CPU-seconds over ``events`` events (NaN without events)."""
    return cpu_s / events * 1e6 if events else math.nan


def finite(value: float | None) -> float | None:
    """``value`` when it is a finite number, else None (JSON has no NaN)."""
    return value if value is not None and math.isfinite(value) else None


def placement() -> tuple[int, int] | None:
    """(CPU for the thing measured's peer, CPU for the other side): the first two CPUs this
    process may run on, or None with fewer than two (then nothing is pinned)."""
    cpus = sorted(os.sched_getaffinity(0))
    return (cpus[0], cpus[1]) if len(cpus) >= 2 else None


def pin_argv(cpu: int | None) -> list[str]:
    """``taskset -c CPU`` to put in front of a command (nothing without taskset or a CPU)."""
    return ["taskset", "-c", str(cpu)] if cpu is not None and shutil.which("taskset") else []


def raise_nofile() -> None:
    """Raise RLIMIT_NOFILE to its hard limit (children inherit it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _name(proc: subprocess.Popen[Any]) -> str:
    args = proc.args if isinstance(proc.args, list) else [proc.args]
    return " ".join(str(a) for a in args[:4])


def module_argv(module: str, *args: str) -> list[str]:
    """``python -m MODULE ARGS`` with this interpreter (works from an installed package)."""
    return [sys.executable, "-m", module, *args]


class Children:
    """The processes a benchmark starts, each in a session of its own; :meth:`close` (also on
    leaving the ``with`` block, whatever the reason) stops every one of them and its group."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Children:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, argv: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start ``argv`` (``subprocess.Popen`` keyword arguments) in a new session. Raises
        :class:`BenchError` when the program cannot be started."""
        try:
            proc = subprocess.Popen(argv, start_new_session=True, **kwargs)
        except OSError as exc:
            raise BenchError(f"cannot start {shlex.join(argv[:3])}: {exc.strerror}") from None
        self.procs.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[Any], timeout_s: float) -> int:
        """Wait for ``proc``; stop it and raise :class:`BenchError` after ``timeout_s``."""
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            raise BenchError(f"{_name(proc)} did not finish in {timeout_s:g} s") from None

    @staticmethod
    def stop(proc: subprocess.Popen[Any], grace_s: float = 5.0) -> None:
        """SIGTERM to ``proc``'s group, SIGKILL after ``grace_s``; safe to call twice."""

        def killpg(sig: int) -> bool:
            try:
                os.killpg(proc.pid, sig)
                return True
            except (ProcessLookupError, PermissionError):
                return False

        if proc.poll() is None:
            killpg(signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        killpg(signal.SIGKILL)  # what is left of the group
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()

    def close(self) -> None:
        while self.procs:
            self.stop(self.procs.pop())


@contextmanager
def interruptible() -> Iterator[None]:
    """Turn the first SIGINT, SIGTERM or SIGHUP into :class:`BenchInterrupted`, so that the
    ``finally`` blocks stop every child; later signals are ignored while they do. Only in the
    main thread (elsewhere: does nothing)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            raise BenchInterrupted(signal.Signals(signum).name)

    watched = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.signal(s, handler) for s in watched}
    try:
        yield
    except KeyboardInterrupt:  # raised by a handler installed inside the block
        raise BenchInterrupted("SIGINT") from None
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


def proc_cpu_s(pid: int) -> float:
    """CPU seconds used by process ``pid``, all its threads: the sum of its threads' on-CPU
    time in ``/proc/PID/task/*/schedstat`` (nanoseconds), else utime + stime of
    ``/proc/PID/stat`` (clock ticks); NaN once it is gone."""
    try:
        total = 0
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended meanwhile
        if total > 0:
            return total / 1e9
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class CpuTrace:
    """A thread that samples a process's CPU time every ``period_s`` against
    ``time.monotonic()``, so that the CPU spent in any window can be read afterwards."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._thread.start()

    def _run(self, period_s: float) -> None:
        while not self._stop.is_set():
            cpu = proc_cpu_s(self.pid)
            if math.isnan(cpu):
                return
            self.samples.append((time.monotonic(), cpu))
            self._stop.wait(period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def between(self, t0: float, t1: float) -> float:
        """CPU seconds spent between monotonic times ``t0`` and ``t1`` (interpolated; NaN
        when the samples do not cover the window)."""
        s = self.samples
        if len(s) < 2 or t1 <= t0 or t0 < s[0][0] - 0.05 or t1 > s[-1][0] + 0.05:
            return math.nan
        return _at(s, t1) - _at(s, t0)


def _at(samples: list[tuple[float, float]], t: float) -> float:
    for (ta, ca), (tb, cb) in zip(samples, samples[1:], strict=False):
        if ta <= t <= tb:
            return ca + (cb - ca) * ((t - ta) / (tb - ta) if tb > ta else 0.0)
    return samples[0][1] if t < samples[0][0] else samples[-1][1]


@dataclass
class Machine:
    """Where a benchmark ran: what bounds every figure it reports."""

    cpus: int
    cpus_allowed: int
    load_avg_before: list[float]
    load_avg_after: list[float] = field(default_factory=list)
    python: str = platform.python_version()
    kernel: str = platform.release()
    host: str = platform.node()

    @classmethod
    def now(cls) -> Machine:
        return cls(
            cpus=os.cpu_count() or 1,
            cpus_allowed=len(os.sched_getaffinity(0)),
            load_avg_before=[round(x, 2) for x in os.getloadavg()],
        )

    def done(self) -> None:
        self.load_avg_after = [round(x, 2) for x in os.getloadavg()]


@dataclass
class Verdict:
    """One benchmark target (docs/bench.md): ``met`` True/False, or None with ``reason``
    when not measured."""

    name: str
    target: str
    value: float | None
    threshold: float | None
    met: bool | None
    reason: str | None = None


def check(name: str, target: str, value: float | None, threshold: float | None, *,
          at_least: bool, missing: str) -> Verdict:  # fmt: skip
    """The verdict of ``value`` against ``threshold`` (``at_least``: value >= threshold, else
    value <= threshold); ``missing`` is the reason when either is None."""
    if value is None or threshold is None:
        return Verdict(name, target, None, threshold, None, missing)
    met = value >= threshold if at_least else value <= threshold
    return Verdict(name, target, value, threshold, met)


def jsonable(obj: Any) -> Any:
    """``obj`` (dataclasses, lists, dicts, floats) as JSON values: NaN and infinities become
    None."""
    if is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(asdict(obj))
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [jsonable(v) for v in obj]
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    return obj
