"""`make bench`: run the benchmarks and write bench/RESULTS.md with the command lines used.

Benchmarks are measurements, not tests: each figure is reported as it comes out, beside its
target, with what bounds it where it misses.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from _egress_levers import FLOOR, LEVERS, measure  # bench/ is sys.path[0]
from _llamacpp_probe_bench import trial as llamacpp_trial
from _probe_bench import run_trials as run_probe_trials

from harness._sim._bench import run_benchmark
from harness.benchmarks import run_client_bench, run_proxy_bench, run_send_lag, run_slow
from harness.benchmarks._proxy_phases import ProxyWorkload
from harness.benchmarks._render import (
    client_cells,
    markdown_table,
    proxy_cells,
    skipped_lines,
    verdict_lines,
)

ROOT = Path(__file__).resolve().parent
SIM_TARGET_STREAMS, SIM_TARGET_TOKENS_PER_S = 2000, 20_000


def _sim_rows() -> list[str]:
    rows = []
    for streams, loop in ((200, "asyncio"), (2000, "asyncio"), (2000, "uvloop")):
        result = run_benchmark(
            streams=streams, max_tokens=200, warmup_s=5, duration_s=20, loop=loop
        )
        met = (
            "yes"
            if streams >= SIM_TARGET_STREAMS and result.tokens_per_s >= SIM_TARGET_TOKENS_PER_S
            else ("no" if streams >= SIM_TARGET_STREAMS else "-")
        )
        bench_cmd = (
            f"python -m harness._sim._bench --streams {streams} --max-tokens 200 "
            f"--warmup-s 5 --duration-s 20 --loop {loop}"
        )
        rows.append(
            f"| {streams} | {loop} | {result.tokens_per_s:,.0f} | "
            f"{result.completed_streams_per_s:,.1f} | {result.mean_running:,.0f} | "
            f"{result.ramp_s:.1f} | {met} | `{bench_cmd}` |"
        )
        print(rows[-1], flush=True)
    return rows


def _progress(line: str) -> None:
    print(f"bench: {line}", file=sys.stderr, flush=True)


def _proxy_section() -> list[str]:
    bench = run_proxy_bench(progress=_progress)
    w, m = bench.workload, bench.machine
    lines = [
        "## Proxies on one SSE workload",
        "",
        "Same machine, same workload for every proxy: a synthetic upstream that streams "
        f"{w.event_bytes}-byte chunked SSE events stamped with CLOCK_MONOTONIC, and a "
        "raw-socket client, both pinned to one CPU; the proxy pinned to the other (`taskset -a`, "
        "all its processes and threads). Latency: "
        f"{w.streams} streams at {w.rate:g} events/s each for {w.duration_s:g} s "
        "(the first second of each stream dropped), upstream write to client read, per "
        f"event; {w.repeats} trials per proxy, round-robin over the proxies, lowest p50 "
        "and p99 kept; added p50/p99 are the proxy's minus the direct (`none`) ones. "
        "Saturation: the same streams with the upstream writing as fast as each connection "
        f"takes ({w.flood_events:,} events each): events/s is the ceiling through the proxy; "
        "CPU is the on-CPU time of the proxy's processes over the phase; CPU µs/event paced is "
        "the same over the latency trials (about one event per read). Stalled: "
        f"{w.stalled} clients with a 4 KiB receive buffer that never read, {w.stalled_kib} KiB "
        "each written by the upstream at once; RSS grown per stream 1 s later, and how many "
        "were already cut by then. Load CPU is the upstream's and the client's CPU over the "
        "saturation phase (near 100 %: the load side, not the proxy, bounds events/s). Proxy "
        "options: see the docstring of `harness/benchmarks/_proxy_bench.py` (all with a 32 KiB "
        "kernel send buffer toward clients). Targets: egress events per CPU-second "
        "at least nginx's (1.0x), added p50 no worse than nginx's, memory per stalled stream at "
        "most nginx's.",
        "",
        f"Command: `{bench.command}`",
        "",
        f"Load average {m.load_avg_before[0]:.1f} before and {m.load_avg_after[0]:.1f} after "
        f"(1 min) on {m.cpus} CPUs (other work on the machine shares both cores).",
        "",
        *markdown_table(proxy_cells(bench)),
        "",
        *(f"- {line}" for line in [*skipped_lines(bench.skipped), *bench.notes]),
        *(f"- {line}" for line in verdict_lines(bench.verdicts)),
        "",
    ]
    return lines


def _sim_section() -> list[str]:
    return [
        "## Engine emulator (`sim`) on one core",
        "",
        f"Target: at least {SIM_TARGET_STREAMS:,} concurrent streams and "
        f"{SIM_TARGET_TOKENS_PER_S:,} tokens/s with the server pinned to one core (core 0) and "
        "the client on the other (core 1). Tokens/s come from the server's own "
        "`vllm:generation_tokens_total`; the step-time model is off so that the emulator "
        "itself is what is measured; ramp is the time until 95 % of the streams ran.",
        "",
        "| streams | event loop | tokens/s | streams done/s | mean running | ramp s | target met "
        "| command |",
        "| ---: | --- | ---: | ---: | ---: | ---: | --- | --- |",
        *_sim_rows(),
        "",
    ]


SLOW_TARGET_STREAMS, SLOW_TARGET_CPU_PCT, SLOW_READ_BYTES_PER_S = 10_000, 50.0, 64


def _n(value: float, digits: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.{digits}f}"


def _load() -> str:
    one, five, _ = os.getloadavg()
    return (
        f"Load average when this section started: {one:.1f} (1 min), {five:.1f} (5 min) on "
        f"{os.cpu_count()} CPUs (other work on the machine shares both cores)."
    )


def _slow_section() -> list[str]:
    load = _load()
    r = run_slow(streams=SLOW_TARGET_STREAMS)
    keeps_pace = r.read_rate_p50_bytes_per_s >= 0.9 * SLOW_READ_BYTES_PER_S
    met = r.streams_open >= SLOW_TARGET_STREAMS and r.cpu_pct < SLOW_TARGET_CPU_PCT and keeps_pace
    row = (
        f"| {r.target_streams:,} | {r.streams_open:,} | {_n(r.cpu_pct, 1)} | {_n(r.rss_mib)} | "
        f"{_n(r.loop_lag_p99_ms, 1)} | {_n(r.read_rate_p50_bytes_per_s, 1)} | {_n(r.ramp_s)} | "
        f"{'yes' if met else 'no'} | `python bench/run.py --only slow` |"
    )
    print(row, flush=True)
    lines = [
        "## Load generator: slow-reader capacity of one load process",
        "",
        f"Target: at least {SLOW_TARGET_STREAMS:,} concurrent streams, each read at 64 B per "
        f"second through a 4 KiB receive buffer (`read = paced, bytes_per_read = 64, "
        f"interval_s = 1`, `rcvbuf_bytes = 4096`), under {SLOW_TARGET_CPU_PCT:g} % of one core. "
        "One Locust process runs the toolkit's locustfile (as `zerowindow run` starts a group) "
        "pinned to core 1; the server is the bench SSE server "
        "(`harness/benchmarks/_sse_server.py`) pinned to core 0, one chunk "
        "(~190 B) per stream per second, written only into writable sockets. CPU is the load "
        "process's user + system time over 15 s once every stream was open (streams open: "
        "the server's count, lowest in that window); loop lag is the gevent hub's p99 in that "
        "window; read rate is each stream's bytes over its first-to-last byte time (p50). "
        "RLIMIT_NOFILE is raised to its hard limit. Ramp: time from starting the load "
        "process until the server counted every stream open (Locust spawns 1,000 users/s).",
        "",
        load,
        "",
        "| streams wanted | streams open | CPU % of one core | RSS MiB | loop lag p99 ms "
        "| read B/s p50 | ramp s | target met | command |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |",
        row,
        "",
    ]
    if not met:
        lines += [_slow_bound(r.streams_open, r.cpu_pct, keeps_pace, r.loop_lag_p99_ms), ""]
    return lines


def _slow_bound(streams_open: int, cpu_pct: float, keeps_pace: bool, lag_ms: float) -> str:
    if streams_open >= SLOW_TARGET_STREAMS and cpu_pct < SLOW_TARGET_CPU_PCT and not keeps_pace:
        return (
            f"Missed: every stream was open at {cpu_pct:.0f} % of a core, but the readers did not "
            f"keep their {SLOW_READ_BYTES_PER_S} B/s (read B/s above): the gevent hub ran up to "
            f"{lag_ms:,.0f} ms late (p99), and a paced reader whose read comes late restarts "
            "its one-second grid from there, so the lateness is never made up. A process "
            "that gets less CPU than it asks for shows exactly this: its CPU share is what the "
            "scheduler gave it (the machine's other work shares core 1), not what it needed."
        )
    if streams_open < SLOW_TARGET_STREAMS:
        return (
            f"Missed: only {streams_open:,} streams were open (file descriptors, the listen "
            "backlog or the spawn rate bound it; see the Locust log)."
        )
    per_stream_us = cpu_pct / 100 / streams_open * 1e6
    return (
        f"Missed: {cpu_pct:.0f} % of a core, {per_stream_us:.0f} µs of CPU per stream per "
        "second (one gevent timer wake-up, one `recv(64)`, h11 and SSE parsing per read)."
    )


def _itl_sections() -> list[str]:
    load = _load()
    bench = run_client_bench(progress=_progress)
    return [
        "## Load generator beside vLLM's benchmark client",
        "",
        f"Two workloads on the bench SSE server (one CPU), which writes {bench.streams} "
        "streams of completion chunks, each carrying its CLOCK_MONOTONIC emission time, read "
        "by each client in turn (the other CPU): at full speed (the server writes as fast as "
        f"each socket takes it, 16 chunks per write, {bench.events:,} chunks per stream: the "
        "events/s there is the client's ceiling, and its CPU per event the cost that bounds "
        "it) and paced (a chunk every "
        f"{bench.interval_ms:g} ms per stream, {bench.offered_events_per_s:,.0f} offered "
        f"events/s, {bench.paced_events:,} chunks per stream; nearly every read holds one "
        "event, as with an engine's token stream, and the CPU per event there is mostly the "
        "event loop's per read). Ours is one Locust process "
        "running the toolkit's locustfile, as `zerowindow run` starts a group: `zerowindow` "
        "stamps each full-speed read with the time the kernel received its last segment "
        "(SO_TIMESTAMPNS, as a run does by default), `zerowindow-read` when `recv` returned "
        "(`timestamps = \"read\"`, as vLLM's client stamps); vLLM's is "
        "`async_request_openai_completions`, the request function of `vllm bench serve`, on "
        "an aiohttp session set up as `vllm/benchmarks/serve.py` does. ITL error: |gap the "
        "client measured - gap between the emission times| over every pair of consecutive "
        "chunks; delay: client timestamp - emission time. CPU: the client process's on-CPU "
        "time from its first to its last chunk. Events/s counts the window in which every "
        "stream was streaming. Targets, ours against vLLM's client in the same "
        "run: CPU per event at full speed at most 0.3x, ceiling at least 1.5x, ITL error p99 "
        "at 20,000 "
        "offered events/s no worse.",
        "",
        f"Command: `{bench.command}`",
        "",
        load,
        "",
        *markdown_table(client_cells(bench)),
        "",
        *(f"- {line}" for line in [*skipped_lines(bench.skipped), *bench.notes]),
        *(f"- {line}" for line in verdict_lines(bench.verdicts)),
        "",
    ]


SEND_LAG_TARGET_P99_MS, SEND_LAG_RATE_RPS = 5.0, 50.0


def _openloop_section() -> list[str]:
    load = _load()
    r = run_send_lag(rate_rps=SEND_LAG_RATE_RPS)
    met = "met" if r.send_lag_p99_ms < SEND_LAG_TARGET_P99_MS else "missed"
    return [
        "## Load generator: open-loop send lag of one load process",
        "",
        f"Target: send lag p99 under {SEND_LAG_TARGET_P99_MS:g} ms at "
        f"{SEND_LAG_RATE_RPS:g} requests/s from one load process. One Locust process runs the "
        'toolkit\'s locustfile with an open-loop group (`arrival = { kind = "poisson", '
        f"rate_rps = {SEND_LAG_RATE_RPS:g}, duration_s = 30 }}`), pinned to core 1, against the "
        "bench SSE server on core 0; each request is answered with 20 chunks 10 ms apart "
        "(~0.2 s, about 10 streams open at a time). Send lag: each request's `t_send` "
        "(when the client began to connect) minus `t_scheduled` (its deadline in the "
        "schedule); loop lag: the gevent hub's p99 while the schedule ran.",
        "",
        f"Command: `{r.command}`",
        "",
        load,
        "",
        "| rate req/s | requests | sent req/s | send lag p50 ms | p99 ms | max ms "
        "| loop lag p99 ms | target met |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        f"| {r.rate_rps:g} | {r.requests:,} | {_n(r.sent_rps, 1)} | {_n(r.send_lag_p50_ms, 2)} "
        f"| {_n(r.send_lag_p99_ms, 2)} | {_n(r.send_lag_max_ms, 2)} | "
        f"{_n(r.loop_lag_p99_ms, 2)} | {met} |",
        "",
    ]


GATE_TRIALS = 20
GATES_COMMAND = [
    "zerowindow", "bench", "gates", "scenarios/gates/ab-baseline.toml",
    "scenarios/gates/ab-slower.toml", "--trials", str(GATE_TRIALS), "--json",
    "--out", "results/gate-trials",
]  # fmt: skip


def gates_lines(data: dict[str, object], *, load: str = "") -> list[str]:
    """The gate-trials section from ``zerowindow bench gates --json`` output."""
    lines = [
        "## Gates: do they flake, do they miss?",
        "",
        "Targets: with the emulator's step time raised by 20 % (A/B) a gate fails in at least "
        "19 of 20 seeded trials; with identical settings (A/A) no gate fails in at least 19 of "
        "20. Each trial: the baseline scenario (3 repeats) saved as a baseline, then the "
        "baseline scenario again and the slower candidate (3 repeats each) gated against it "
        "(docs/gates.md).",
        "",
        f"Command: `{data['command']} --json`",
        "",
        load,
        "",
        "| experiment | trials | a gate failed | target | met | verdicts per gate |",
        "| --- | ---: | ---: | --- | --- | --- |",
    ]
    for name, target in (("A/B", "failed in >= 19 of 20"), ("A/A", "failed in <= 1 of 20")):
        exp = data[name]
        assert isinstance(exp, dict)
        trials, failed = int(exp["trials"]), int(exp["failed"])
        met = failed >= trials - 1 if name == "A/B" else failed <= 1
        verdicts = "; ".join(
            f"`{gate}`: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            for gate, counts in exp["verdicts"].items()
        )
        lines.append(
            f"| {name} | {trials} | {failed} | {target} | {'yes' if met else 'no'} | {verdicts} |"
        )
    errors = data.get("errors") or []
    assert isinstance(errors, list)
    lines += ["", *(f"Not judged: {e}" for e in errors), ""] if errors else [""]
    return lines


def _gates_section() -> list[str]:
    load = _load()
    zw = str(Path(sys.executable).with_name("zerowindow"))
    out = subprocess.run([zw, *GATES_COMMAND[1:]], capture_output=True, text=True, check=True)
    return gates_lines(json.loads(out.stdout), load=load)


PROBE_TARGET_SLOWDOWN_PCT = 2.0


def _probe_section() -> list[str]:
    repeats, prompts, max_tokens = 3, 32, 900
    load = _load()
    trials = run_probe_trials(repeats=repeats, prompts=prompts, max_tokens=max_tokens)
    rows = [
        f"| {'on' if t.probe else 'off'} | {t.tokens:,} | {t.tokens_per_s:,.0f} | "
        f"{t.generate_s:.2f} | {t.step_rows:,} | "
        + (
            f"{t.probe_cpu_s:.3f} | {t.probe_cpu_s / t.generate_s * 100:.2f} |"
            if t.probe
            else "- | - |"
        )
        for t in trials
    ]
    off = sorted(t.tokens_per_s for t in trials if not t.probe)
    on = sorted(t.tokens_per_s for t in trials if t.probe)
    median_off, median_on = off[len(off) // 2], on[len(on) // 2]
    ab = (median_off - median_on) / median_off * 100.0
    noise = (off[-1] - off[0]) / off[-1] * 100.0
    cost = max(t.probe_cpu_s / t.generate_s * 100.0 for t in trials if t.probe)
    met = "met" if cost < PROBE_TARGET_SLOWDOWN_PCT else "missed"
    command = (
        f"python bench/_probe_bench.py trials --repeats {repeats} --prompts {prompts} "
        f"--max-tokens {max_tokens}"
    )
    return [
        "## Engine probe overhead on the tiny model",
        "",
        f"Target: vLLM with the engine probe less than {PROBE_TARGET_SLOWDOWN_PCT:g} % slower "
        "than without. Each trial is a fresh process running vLLM's offline engine "
        "(`vllm.LLM`, no HTTP server) pinned to core 0, generating "
        f"{prompts} completions of {max_tokens} tokens (`ignore_eos`) at once after a warm-up; "
        "tokens/s is generated tokens over the wall time of `LLM.generate`. Trials alternate "
        "off and on. Probe CPU is what the probe measured for itself over the engine's whole "
        "life (`engine_probe.json` `cost`: its code on the engine thread, timed around each "
        "hook, plus its flushing thread's CPU time), shown as a share of the timed generate "
        "(an upper bound: it includes start-up and warm-up).",
        "",
        f"Command: `{command}`",
        "",
        load,
        "",
        "| probe | tokens | tokens/s | generate s | step rows | probe CPU s | probe CPU % |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        *rows,
        "",
        f"- probe CPU at most {cost:.2f} % of the generate time; target under "
        f"{PROBE_TARGET_SLOWDOWN_PCT:g} %: {met}.",
        f"- tokens/s, median with the probe {median_on:,.0f} against {median_off:,.0f} "
        f"without ({ab:+.1f} %, positive: slower). The trials without the probe spread by "
        f"{noise:.1f} % among themselves on this shared machine, so this comparison cannot "
        "resolve a 2 % difference here; the probe's own CPU time is the figure that can.",
        "",
    ]


def _llamacpp_probe_section() -> list[str]:
    trials, requests, max_tokens = 7, 3, 500
    load = _load()
    runs = [
        llamacpp_trial(probe, requests=requests, max_tokens=max_tokens)
        for _ in range(trials)
        for probe in (False, True)
    ]
    off = sorted(t.tokens_per_s for t in runs if not t.probe)
    on = sorted(t.tokens_per_s for t in runs if t.probe)
    median_off, median_on = off[len(off) // 2], on[len(on) // 2]
    noise = (off[-1] - off[0]) / off[-1] * 100.0
    command = (
        f"python bench/_llamacpp_probe_bench.py --trials {trials} --requests {requests} "
        f"--max-tokens {max_tokens}"
    )
    rows = [
        f"| {'wrapper' if t.probe else 'plain'} | {t.tokens:,} | {t.stream_s:.2f} | "
        f"{t.tokens_per_s:,.0f} |"
        for t in runs
    ]
    return [
        "## llama-cpp-python probe wrapper against the plain server",
        "",
        "llama-cpp-python's OpenAI server on the tiny GGUF model, started plainly "
        "(`python -m llama_cpp.server`, the anchor) and through the probe wrapper "
        "(`harness._engine_probe._llamacpp_python`, recording every token), trials "
        f"alternating in one run; each trial is a fresh server, one warm-up, then {requests} "
        f"streams of {max_tokens} tokens to a full-speed reader, one after the other; tokens/s "
        "is their tokens over the time from the first one's first token to the last one's last.",
        "",
        f"Command: `{command}`",
        "",
        load,
        "",
        "| server | tokens | stream s | tokens/s |",
        "| --- | ---: | ---: | ---: |",
        *rows,
        "",
        f"- median tokens/s, wrapper over plain: {median_on / median_off:.3f} "
        f"({median_on:,.0f} against {median_off:,.0f}). The plain trials spread by "
        f"{noise:.1f} % among themselves on this shared machine: a difference smaller than "
        "that is not resolved here.",
        "",
    ]


def _levers_section() -> list[str]:
    rounds = 5
    load = _load()
    results = measure(rounds, ProxyWorkload())
    rows = [
        f"| {r.name} | {r.median_us:.2f} | {r.events_per_cpu_s:,.0f} | {r.x_nginx:.2f} | "
        f"{', '.join(f'{v:.2f}' for v in r.cpu_us_per_event)} |"
        for r in results
    ]
    by = {r.name: r for r in results}
    base = by["egress"]

    def change(name: str) -> str:
        return f"{(by[name].median_us / base.median_us - 1) * 100:+.0f} %"

    return [
        "## Egress buffer: CPU per event, lever by lever",
        "",
        "The proxy bench's saturation phase (64 streams x 5,000 events of 200 bytes, written as "
        "fast as each connection takes; upstream and client on one CPU, the proxy on the "
        f"other) through nginx, through the egress buffer with one setting changed at a "
        "time from the bench's `egress` configuration, and through a byte pipe on uvloop "
        "(`bench/_byte_pipe.py`: one write per read, no HTTP parsing, no watchdog; the floor "
        f"under any proxy in Python); {rounds} rounds over every "
        "configuration in turn, a fresh proxy each time; the median CPU µs per event of each "
        "is kept (`bench/_egress_levers.py`).",
        "",
        f"Command: `python bench/_egress_levers.py --rounds {rounds}`",
        "",
        load,
        "",
        "| configuration | CPU µs/event (median) | events per CPU-s | x nginx | every round |",
        "| --- | ---: | ---: | ---: | --- |",
        *rows,
        "",
        f"- uvloop's transports against asyncio's: {change(list(LEVERS)[1])} CPU per event "
        "without them (kept).",
        f"- `TCP_NOTSENT_LOWAT` 16 KiB: {change(list(LEVERS)[2])} without it: it costs nothing "
        "measurable, and keeps the backlog in the proxy where it is counted (kept).",
        f"- `TCP_NODELAY` off (Nagle, RFC 896): {change(list(LEVERS)[3])}: the kernel sends "
        "fewer, fuller packets (measured once: 0.77 against 1.23 packets per event, `perf stat "
        "-e net:net_dev_queue` on the proxy). It is not the default: it holds a token written "
        "while earlier bytes are unacknowledged for up to a round trip, and up to the "
        "client's delayed ACK (40 ms) on a fresh response, the latency this proxy exists to "
        "protect; nginx also sets `TCP_NODELAY` on these connections. `client_tcp_nodelay = "
        "false` offers it, as nginx's `tcp_nodelay off`.",
        "- Measured once each with a patched build, 5 rounds, not kept in `make bench`: "
        "without httptools' per-chunk callbacks 7.70 against 7.74 µs/event (no change); "
        "`TCP_QUICKACK` off on the upstream socket: ACKs to the upstream 1.04 instead of 1.17 "
        "packets per event, CPU per event unchanged within the rounds' spread.",
        "- `os.splice` through a pipe was not built: the pass-through path must see every byte "
        "(llhttp checks the chunked framing, so that an upstream's malformed or truncated body "
        "never reaches the client as complete, and finds the end of the response so that the "
        "client's connection can be reused); a 200-byte event costs its syscalls and packets, "
        "not its copy (`perf record`, once: 72 % of the egress's CPU is in the kernel's TCP "
        "path, 18 % in the interpreter, 6 % in uvloop, 2 % in httptools).",
        f"- The byte pipe: {by[FLOOR].x_nginx:.2f}x nginx's events per CPU-second, "
        f"{change(FLOOR)} CPU per event against the egress buffer. What the egress buffer adds "
        "to it (the framing check, the bookkeeping, the stall watchdog) can be made cheaper; "
        "the pipe itself is the most a proxy in Python on uvloop reaches here.",
        "",
    ]


def _history_section() -> list[str]:
    runs, step_at, cost_runs = 60, 31, 1000
    command = (
        f"python bench/_history_bench.py --runs {runs} --step-at {step_at} "
        f"--cost-runs {cost_runs} --json bench/history_series.json"
    )
    load = _load()
    subprocess.run([sys.executable, *command.split()[1:]], check=True, cwd=ROOT.parent)
    return history_lines(json.loads((ROOT / "history_series.json").read_text()), command, load)


def history_lines(data: dict[str, Any], command: str, load: str) -> list[str]:
    """The history section of RESULTS.md from ``bench/_history_bench.py``'s JSON."""
    from harness.history import change_points, judge_trend

    rows = []
    for name in ("aa", "step"):
        for figure, values in data[name]["values"].items():
            fails = [n for n in range(6, len(values) + 1)
                     if judge_trend(values[:n], figure, within=0.10).failed]  # fmt: skip
            points = "; ".join(
                f"run {p.index + 1}: {p.change * 100:+.1f}% [{p.low * 100:+.1f}, "
                f"{p.high * 100:+.1f}], p={p.p_value:.2g}"
                for p in change_points(values)
            )
            rows.append(
                f"| {'A/A' if name == 'aa' else 'step at run ' + str(data[name]['step_at'])} | "
                f"`{figure}` | {points or 'none'} | {fails[0] if fails else '-'} | "
                f"{len(fails)} of {len(values) - 5} |"
            )
    cost = data["cost"]
    return [
        "## History: change points on real runs, and the store's cost",
        "",
        "Two series of 60 short runs of one scenario on the engine emulator (4 users x 3 "
        "requests of 100 tokens; each run started its own emulator and added itself to its own "
        "history as `zerowindow run` does): A/A, and a step series whose engine is 15 % slower "
        "per step (`step_fixed_ms`, `decode_ms_per_seq`, `prefill_ms_per_token` x 1.15) from "
        "run 31 on. Change points: Apache Otava on the whole series (p < 0.001). First failing "
        "run: the first run whose own gate `FIGURE ~ history within 10%` fails, judged on the "
        "runs up to it; failing runs: how many of runs 6..60 fail it.",
        "",
        f"Command: `{command}`",
        "",
        load,
        "",
        "| series | figure | change points (size [95% interval], p) | first failing run | "
        "failing runs |",
        "| --- | --- | --- | ---: | ---: |",
        *rows,
        "",
        f"Cost at {cost['entries']:,} runs ({cost['figures_per_entry']} figures each, "
        f"{cost['file_bytes'] / 2**20:.1f} MiB file): adding one run {cost['add_one_s']:.3f} s "
        f"(the end of every run); `history show` (read, change points on "
        f"{cost['show_figures']} figures, history.html) {cost['show_s']:.2f} s; filling the "
        f"{cost['entries'] - 1:,} runs in one transaction {cost['fill_s']:.2f} s.",
        "",
    ]


SECTIONS = {
    "sim": _sim_section,
    "proxies": _proxy_section,
    "egress-levers": _levers_section,
    "slow": _slow_section,
    "itl": _itl_sections,
    "probe": _probe_section,
    "llamacpp-probe": _llamacpp_probe_section,
    "openloop": _openloop_section,
    "gates": _gates_section,
    "history": _history_section,
}


def _split_sections(text: str) -> dict[str, str]:
    """Existing RESULTS.md sections by heading (``## ...``), header text under ``""``."""
    parts = re.split(r"(?m)^(?=## )", text)
    out = {"": parts[0]}
    for part in parts[1:]:
        out[part.splitlines()[0]] = part
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run the benchmarks, write bench/RESULTS.md")
    parser.add_argument(
        "--only", default=",".join(SECTIONS),
        help=f"comma-separated sections to run ({', '.join(SECTIONS)}); the others are kept "
        "from the existing RESULTS.md",
    )  # fmt: skip
    args = parser.parse_args(argv)
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown sections {', '.join(unknown)}; valid: {', '.join(SECTIONS)}")
    path = ROOT / "RESULTS.md"
    old = _split_sections(path.read_text()) if path.exists() else {}
    new: dict[str, str] = {}
    for name in chosen:
        new.update(_split_sections("\n".join(SECTIONS[name]()) + "\n"))
    new.pop("", None)
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    head = "\n".join([
        "# Benchmark results",
        "",
        f"Written by `make bench` ({' '.join([Path(sys.executable).name, *sys.argv])}) on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{cpu} CPUs, Python {platform.python_version()}, kernel {platform.release()}. "
        "Other processes on the machine were not controlled; run it again on a quiet machine "
        "before comparing. `python bench/run.py --only slow,itl` reruns some sections and "
        "keeps the others.",
        "",
        "",
    ])  # fmt: skip
    order = [h for h in old if h] + [h for h in new if h not in old]
    body = "\n".join(new.get(h, old.get(h, "")).rstrip("\n") + "\n" for h in order)
    path.write_text(head + body.rstrip("\n") + "\n")
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT.parent)
    sys.path.insert(0, str(ROOT.parent))
    sys.exit(main())
