"""`make bench`: run the benchmarks and write bench/RESULTS.md with the command lines used.

Benchmarks are measurements, not tests: each figure is reported as it comes out, beside its
target, with what bounds it where it misses.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from pathlib import Path

from harness._sim._bench import run_benchmark

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


def main() -> int:
    cpu = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    lines = [
        "# Benchmark results",
        "",
        f"Written by `make bench` ({' '.join([Path(sys.executable).name, *sys.argv])}) on "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{cpu} CPUs, Python {platform.python_version()}, kernel {platform.release()}. "
        "Other processes on the machine were not controlled; run it again on a quiet machine "
        "before comparing.",
        "",
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
    (ROOT / "RESULTS.md").write_text("\n".join(lines))
    print(f"written {ROOT / 'RESULTS.md'}")
    return 0


if __name__ == "__main__":
    os.chdir(ROOT.parent)
    sys.exit(main())
