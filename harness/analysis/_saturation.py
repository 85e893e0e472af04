"""Client-saturation guard: were the load processes fast enough for their latency figures?

A load process short of CPU, or whose gevent hub runs late, reads several SSE events in one
``recv`` and timestamps them together: measured ITL collapses towards 0 while chunk gaps grow
(on a 2-core machine a true 50 ms gap has been measured as 300 ms at p99). Each load process
samples its CPU use and loop lag into a JSON-lines file (``loadgen._saturation``, enabled by
the environment variable ``ZW_SATURATION``); :func:`saturation_summary` reads those files and
says whether the run's latency figures can be trusted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.analysis._latency import percentile
from harness.runfolder import ProcessSaturation, SaturationSummary

FILE_PREFIX = "saturation-"


def saturation_summary(
    paths: list[Path],
    *,
    cpu_limit_pct: float = 85.0,
    lag_limit_ms: float = 5.0,
    max_fraction: float = 0.10,
    placement: dict[str, Any] | None = None,
) -> SaturationSummary:
    """Summarise the saturation samples in ``paths`` (one file per user group, possibly several
    processes per file, told apart by ``pid``).

    A sample is *over* when the process used more than ``cpu_limit_pct`` percent of one core
    over the sample's interval (a single-threaded gevent process cannot use more than 100: at
    85 % it has little slack left to run greenlets when their sockets become readable), or when
    its gevent hub woke the sampler more than ``lag_limit_ms`` late (every greenlet waiting on
    a socket waited that long too, so timestamps taken then are off by as much; compare with
    ITL figures of a few ms). A process is *saturated* when more than ``max_fraction`` of its
    samples are over (the samples are taken at random phases, so this is the fraction of the
    run's time); the run is saturated when any process is.

    ``message`` is ``"client saturated: latency figures unreliable (group G: 93 % of samples
    above 85 % CPU, ...)"``, ``"client not saturated"``, or says that nothing was sampled.
    ``placement`` is run.json's ``placement``; a saturated client run without one is told why
    (``...; no CPU placement: impossible: 1 usable CPU``).
    Lines that are not valid samples (e.g. a last line cut by a killed process) are skipped.
    Raises ``ValueError`` for limits out of range.
    """
    if not 0 <= max_fraction < 1:
        raise ValueError(f"max_fraction must be within [0, 1), got {max_fraction}")
    if cpu_limit_pct <= 0 or lag_limit_ms <= 0:
        raise ValueError("cpu_limit_pct and lag_limit_ms must be positive")
    processes: list[ProcessSaturation] = []
    unsampled: list[str] = []
    for path in paths:
        by_pid = _read_samples(Path(path))
        if not by_pid:
            unsampled.append(str(path))
        for pid, samples in sorted(by_pid.items()):
            processes.append(
                _process_figures(
                    Path(path), pid, samples, cpu_limit_pct, lag_limit_ms, max_fraction
                )
            )
    saturated = any(p.saturated for p in processes)
    if not processes:
        message = "client saturation unknown: nothing was sampled"
    elif saturated:
        details = "; ".join(
            _details(p, cpu_limit_pct, lag_limit_ms, several_pids=_shares_file(p, processes))
            for p in processes
            if p.saturated
        )
        message = f"client saturated: latency figures unreliable ({details})"
        if placement is not None and not placement.get("applied"):
            message += f"; no CPU placement: {placement.get('reason')}"
    else:
        message = "client not saturated"
        if unsampled:
            message += " (no samples from: " + ", ".join(_group_name(Path(u)) for u in unsampled)
            message += ")"
    return SaturationSummary(
        cpu_limit_pct=cpu_limit_pct,
        lag_limit_ms=lag_limit_ms,
        max_fraction=max_fraction,
        processes=processes,
        unsampled=unsampled,
        saturated=saturated,
        message=message,
    )


Sample = tuple[float, float, float]  # t (s), cpu_pct, loop_lag_ms


def _read_samples(path: Path) -> dict[int, list[Sample]]:
    by_pid: dict[int, list[Sample]] = {}
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return by_pid
    for line in text.splitlines():
        try:
            obj = json.loads(line)
            sample = (float(obj["t"]), float(obj["cpu_pct"]), float(obj["loop_lag_ms"]))
            pid = int(obj["pid"])
        except (ValueError, TypeError, KeyError):
            continue
        by_pid.setdefault(pid, []).append(sample)
    return by_pid


def _process_figures(
    path: Path,
    pid: int,
    samples: list[Sample],
    cpu_limit_pct: float,
    lag_limit_ms: float,
    max_fraction: float,
) -> ProcessSaturation:
    t = [s[0] for s in samples]
    cpu = [s[1] for s in samples]
    lag = [s[2] for s in samples]
    n = len(samples)
    over_cpu = sum(c > cpu_limit_pct for c in cpu) / n
    over_lag = sum(g > lag_limit_ms for g in lag) / n
    over_any = sum(c > cpu_limit_pct or g > lag_limit_ms for c, g in zip(cpu, lag, strict=True))
    return ProcessSaturation(
        group=_group_name(path),
        path=str(path),
        pid=pid,
        samples=n,
        span_s=max(t) - min(t),
        cpu_p50_pct=percentile(cpu, 50) or 0.0,
        cpu_max_pct=max(cpu),
        loop_lag_p50_ms=percentile(lag, 50) or 0.0,
        loop_lag_p99_ms=percentile(lag, 99) or 0.0,
        loop_lag_max_ms=max(lag),
        over_cpu_fraction=over_cpu,
        over_lag_fraction=over_lag,
        over_any_fraction=over_any / n,
        saturated=over_any / n > max_fraction,
    )


def _group_name(path: Path) -> str:
    name = path.name.removesuffix(".jsonl")
    return name.removeprefix(FILE_PREFIX) or name


def _shares_file(p: ProcessSaturation, processes: list[ProcessSaturation]) -> bool:
    return sum(q.path == p.path for q in processes) > 1


def _details(
    p: ProcessSaturation, cpu_limit_pct: float, lag_limit_ms: float, *, several_pids: bool
) -> str:
    who = f"group {p.group}" + (f" pid {p.pid}" if several_pids else "")
    parts = []
    if p.over_cpu_fraction > 0:
        parts.append((p.over_cpu_fraction, f"{cpu_limit_pct:g} % CPU"))
    if p.over_lag_fraction > 0:
        parts.append((p.over_lag_fraction, f"{lag_limit_ms:g} ms loop lag"))
    text = " and ".join(f"{round(100 * f)} % above {limit}" for f, limit in parts)
    return f"{who}: " + text.replace(" % above", " % of samples above", 1)
