"""``zerowindow bench proxy``: the proxy kinds on one SSE workload, what each costs healthy
readers, and the targets for the egress buffer against nginx.

One synthetic upstream and one raw-socket client (:mod:`harness.benchmarks._upstream`) run
pinned to one CPU; the proxy under test runs pinned to another (every process and thread of
its group, ``taskset -a``). For each proxy:

- latency: ``streams`` streams paced at ``rate`` events/s each; per event, the time from the
  upstream's write to the client's read (the first second of each stream dropped); the
  proxy's p50 and p99 minus those of the direct path (``none``) are the latency it adds. All
  proxies run at once and the trials go round-robin ``repeats`` times; each proxy keeps its
  lowest p50 and p99 (load from elsewhere on the machine only ever adds latency);
- saturation: the same streams with the upstream writing as fast as each connection takes;
  events/s received by the client (the ceiling through the proxy), the proxy's CPU seconds
  (utime+stime of its processes) per event, and events per proxy CPU-second;
- stalled streams: ``stalled`` clients with a 4 KiB receive buffer that never read, each sent
  ``stalled_kib`` KiB that the upstream writes at once; the proxy's resident memory (RSS of
  its process group) grown per stalled stream, 1 s after the requests were sent.

The proxies measured are every configuration a registered proxy kind declares
(:meth:`~harness.servers.ProxyConfigBase.for_bench`; a kind that declares none is not
benchmarkable), each with its defaults except: every proxy's kernel send buffer toward clients
is 32 KiB (the egress buffer's default) and a write-stall cut of about 3 s where the kind has
one. The built-in kinds' (each kind's ``for_bench`` says): nginx is the ``buffered-reset``
preset, HAProxy has ``timeout client 3s`` and ``option nolinger`` (``haproxy-nodelay``: also
``option http-no-delay``), Envoy a 3 s stream idle timeout, and the egress buffer pauses
reading the upstream when a stream's 256 KiB are full instead of cutting the client (the
saturation phase's upstream outruns even a reader that keeps up). The phases themselves are in
:mod:`harness.benchmarks._proxy_phases`.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from harness.benchmarks._common import (
    BenchError,
    Children,
    Machine,
    Verdict,
    check,
    finite,
    placement,
    raise_nofile,
    ratio,
    us_per_event,
)
from harness.benchmarks._proxy_phases import (
    ProxyWorkload,
    cpu_s,
    group_processes,
    latency_trial,
    pin,
    saturation,
    stalled_memory,
    start_upstream,
)
from harness.servers import PROXIES, Proxy, ProxyConfigBase, make_proxy
from zwcore import ZerowindowError

SNDBUF = 32 * 1024
"""The kernel send buffer toward clients of every proxy measured (bytes)."""
BASELINE = "none"
"""The configuration measured first, whose latency the others' added latency is taken from."""
# The targets for the egress buffer, against nginx measured in the same run.
TARGET_CPU_RATIO = 1.0  # egress events per CPU-second >= nginx's (issue 28)


def bench_configs() -> dict[str, ProxyConfigBase]:
    """The proxy configurations the benchmark can measure, by name: every configuration of
    every registered proxy kind that declares itself benchmarkable
    (:meth:`~harness.servers.ProxyConfigBase.for_bench`, with a :data:`SNDBUF` send buffer),
    :data:`BASELINE` first, then by kind. Raises :class:`BenchError` when two kinds give one
    name, or none gives :data:`BASELINE`."""
    configs: dict[str, ProxyConfigBase] = {}
    for model in PROXIES.models():
        for name, config in model.for_bench(client_sndbuf_bytes=SNDBUF).items():
            if name in configs:
                raise BenchError(
                    f"proxy bench configuration {name!r} is given by both proxy kinds "
                    f"{configs[name].kind!r} and {config.kind!r}"
                )
            configs[name] = config
    if BASELINE not in configs:
        raise BenchError(f"no proxy kind gives the bench's baseline configuration {BASELINE!r}")
    return {BASELINE: configs.pop(BASELINE), **configs}


PROXY_NAMES: tuple[str, ...] = tuple(bench_configs())
"""The names of :func:`bench_configs` when this module was first imported (the built-in kinds
and any registered before): the command line's choices. :func:`run_proxy_bench` takes those of
the kinds registered when it is called."""


@dataclass
class ProxyResult:
    """One proxy's figures (None where not measured: ``none`` has no process to measure)."""

    proxy: str
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None
    added_p99_ms: float | None
    events_per_s: float | None  # saturation: the ceiling through the proxy
    cpu_us_per_event: float | None
    events_per_cpu_s: float | None
    proxy_cpu_util: float | None  # share of one core over the saturation phase
    load_cpu_util: float | None  # upstream + client, share of one core
    rss_per_stalled_kib: float | None
    stalled_cut: int | None  # stalled streams already cut when their memory was read
    events_lost: int  # events the client did not receive, every phase
    paced_cpu_us_per_event: float | None = None  # the latency trials: about one event per read


@dataclass
class ProxyBench:
    """What ``zerowindow bench proxy`` measured: every figure, the ratios against nginx, the
    targets and their verdicts, the machine and the command line."""

    command: str
    workload: ProxyWorkload
    proxies: dict[str, ProxyResult]
    skipped: dict[str, str]  # proxy: why it was not measured
    ratios_to_nginx: dict[str, dict[str, float | None]]
    verdicts: list[Verdict]
    machine: Machine
    notes: list[str] = field(default_factory=list)


def proxy_command(names: tuple[str, ...], w: ProxyWorkload) -> str:
    """The ``zerowindow bench proxy`` command line of this run, every option spelled out."""
    return (
        f"zerowindow bench proxy --proxies {','.join(names)} --streams {w.streams} "
        f"--rate {w.rate:g} --duration-s {w.duration_s:g} --repeats {w.repeats} "
        f"--flood-events {w.flood_events} --event-bytes {w.event_bytes} "
        f"--stalled {w.stalled} --stalled-kib {w.stalled_kib}"
    )


def _find_binary(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))


def missing_reason(name: str, config: ProxyConfigBase) -> str | None:
    """Why proxy ``name`` cannot run here (its program is not installed), or None."""
    binary = getattr(config, "binary", None)
    if binary is None or _find_binary(binary) is not None:
        return None
    hint = getattr(config.build(), "binary_hint", "")
    return f"{binary!r} is not on PATH" + (f" ({hint})" if hint else "")


def _measure(
    names: list[str], upstream_port: int, load: list[psutil.Process], w: ProxyWorkload,
    proxy_cpu: int | None, skipped: dict[str, str], say: Callable[[str], None],
) -> dict[str, ProxyResult]:  # fmt: skip
    """Start every proxy in ``names`` (pinned to ``proxy_cpu``); one that does not start is
    put in ``skipped`` with the reason. Run the latency trials round-robin ``w.repeats`` times
    (so a burst of load from elsewhere on the machine hits every proxy alike), keeping each
    proxy's lowest p50 and p99; then the stalled and saturation phases proxy by proxy; stop
    them all."""
    configs = bench_configs()
    started: dict[str, tuple[Proxy, int, list[psutil.Process]]] = {}
    with tempfile.TemporaryDirectory(prefix="zw-bench-proxies-") as tmp:
        try:
            for name in names:
                proxy = make_proxy(configs[name])
                started[name] = (proxy, 0, [])
                try:
                    url = proxy.start(Path(tmp) / name, f"http://127.0.0.1:{upstream_port}")
                except ZerowindowError as exc:
                    if name == BASELINE:
                        raise
                    skipped[name] = f"did not start: {str(exc).splitlines()[0]}"
                    continue
                procs = group_processes(proxy)
                pin(procs, proxy_cpu)
                started[name] = (proxy, int(url.rsplit(":", 1)[1]), procs)
            running = [n for n in names if n not in skipped]
            say(f"latency: {w.repeats} x {w.duration_s:g} s through each of {', '.join(running)}")
            trials: dict[str, list[tuple[float, float, int]]] = {n: [] for n in running}
            paced_cpu_s = dict.fromkeys(running, 0.0)
            for _ in range(w.repeats):
                for name in running:
                    procs = started[name][2]
                    cpu0 = cpu_s(procs)
                    try:
                        trials[name].append(latency_trial(started[name][1], w))
                    except OSError as exc:  # refused, reset, or answered other than 200
                        raise BenchError(f"{name}: the paced streams failed: {exc}") from None
                    paced_cpu_s[name] += cpu_s(procs) - cpu0
            base_p50 = min(t[0] for t in trials[BASELINE])
            base_p99 = min(t[1] for t in trials[BASELINE])
            results = {}
            for name in running:
                _, port, procs = started[name]
                p50 = min(t[0] for t in trials[name])
                p99 = min(t[1] for t in trials[name])
                lost = sum(t[2] for t in trials[name])
                # stalled first: after the saturation phase the proxy's allocator keeps the
                # pages it grew to, and the stalled streams' buffers would reuse them unseen
                r = ProxyResult(
                    proxy=name, p50_ms=p50, p99_ms=p99,
                    added_p50_ms=None if name == BASELINE else p50 - base_p50,
                    added_p99_ms=None if name == BASELINE else p99 - base_p99,
                    events_per_s=None, cpu_us_per_event=None, events_per_cpu_s=None,
                    proxy_cpu_util=None, load_cpu_util=None, rss_per_stalled_kib=None,
                    stalled_cut=None, events_lost=lost,
                    paced_cpu_us_per_event=us_per_event(
                        paced_cpu_s[name], w.repeats * w.streams * w.paced_events - lost
                    ) if procs else None,
                )  # fmt: skip
                if procs:  # none: no process of its own to measure
                    say(f"{name}: stalled streams, then saturation")
                    r.rss_per_stalled_kib, r.stalled_cut = stalled_memory(port, procs, w)
                    try:
                        (r.events_per_s, r.cpu_us_per_event, r.events_per_cpu_s,
                         r.proxy_cpu_util, r.load_cpu_util, sat_lost) = saturation(
                            port, procs, load, w)  # fmt: skip
                    except OSError as exc:
                        raise BenchError(f"{name}: the saturation streams failed: {exc}") from None
                    r.events_lost += sat_lost
                results[name] = r
            return results
        finally:
            for proxy, _, _ in started.values():
                proxy.stop()


def _verdicts(results: dict[str, ProxyResult], skipped: dict[str, str]) -> list[Verdict]:
    egress, nginx = results.get("egress"), results.get("nginx")
    missing = "; ".join(
        f"{n} not measured: {skipped.get(n, 'not in --proxies')}"
        for n in ("egress", "nginx")
        if n not in results
    )

    def fig(r: ProxyResult | None, key: str) -> float | None:
        return None if r is None else finite(getattr(r, key))

    return [
        check(
            "egress_events_per_cpu_s",
            f"egress events per CPU-second >= {TARGET_CPU_RATIO:g}x nginx's (value: the ratio)",
            ratio(fig(egress, "events_per_cpu_s"), fig(nginx, "events_per_cpu_s")),
            TARGET_CPU_RATIO, at_least=True, missing=missing,
        ),
        check(
            "egress_added_p50", "egress added p50 ms <= nginx's added p50 ms (the threshold)",
            fig(egress, "added_p50_ms"), fig(nginx, "added_p50_ms"), at_least=False,
            missing=missing,
        ),
        check(
            "egress_memory_per_stalled_stream",
            "egress KiB per stalled stream <= nginx's (the threshold)",
            fig(egress, "rss_per_stalled_kib"), fig(nginx, "rss_per_stalled_kib"),
            at_least=False, missing=missing,
        ),
    ]  # fmt: skip


def _ratios(results: dict[str, ProxyResult]) -> dict[str, dict[str, float | None]]:
    nginx = results.get("nginx")
    if nginx is None:
        return {}
    keys = ("events_per_s", "events_per_cpu_s", "cpu_us_per_event", "p50_ms", "p99_ms",
            "rss_per_stalled_kib")  # fmt: skip
    return {
        name: {k: ratio(getattr(r, k), getattr(nginx, k)) for k in keys}
        for name, r in results.items()
        if name != "nginx"
    }


def run_proxy_bench(
    names: tuple[str, ...] | None = None,
    workload: ProxyWorkload | None = None,
    *,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ProxyBench:
    """Measure every proxy configuration in ``names`` (default: every one of
    :func:`bench_configs`; ``none``, the direct path, is always measured first: the baseline of
    added latency) on ``workload``; a proxy whose program is not installed, or that does not
    start, is skipped with the reason. Raises :class:`BenchError` for an unknown proxy name or
    a bad workload. ``progress`` receives a line before each phase."""
    say = progress or (lambda line: None)
    w = workload or ProxyWorkload()
    w.check()
    configs = bench_configs()
    names = tuple(configs) if names is None else names
    unknown = [n for n in names if n not in configs]
    if unknown:
        raise BenchError(f"--proxies: unknown {', '.join(unknown)}; valid: {', '.join(configs)}")
    order = [BASELINE, *dict.fromkeys(n for n in names if n != BASELINE)]
    skipped: dict[str, str] = {}
    for name in order:
        if (why := missing_reason(name, configs[name])) is not None:
            skipped[name] = why
    machine = Machine.now()
    pair = placement()
    proxy_cpu, load_cpu = pair if pair is not None else (None, None)
    affinity = os.sched_getaffinity(0)
    raise_nofile()
    try:
        with Children() as children:
            port, upstream = start_upstream(children, load_cpu)
            if load_cpu is not None:
                os.sched_setaffinity(0, {load_cpu})  # the client: this process
            load = [upstream, psutil.Process()]
            results = _measure(
                [n for n in order if n not in skipped], port, load, w, proxy_cpu, skipped, say
            )
    finally:
        os.sched_setaffinity(0, affinity)
    machine.done()
    notes = [f"{name}: {r.events_lost} events lost" for name, r in results.items() if r.events_lost]
    return ProxyBench(
        command=command or proxy_command(names, w),
        workload=w,
        proxies=results,
        skipped=skipped,
        ratios_to_nginx=_ratios(results),
        verdicts=_verdicts(results, skipped),
        machine=machine,
        notes=notes,
    )
