"""Self-checks of the toolkit's own machinery, run on the user's machine before trusting its
figures: ``zerowindow bench client`` (our load client beside vLLM's benchmark client) and
``zerowindow bench proxy`` (the egress buffer beside nginx, HAProxy and Envoy), with the
targets of docs/bench.md as verdicts. ``make bench`` (bench/run.py) writes bench/RESULTS.md
from the same functions.

One concern per module: the bench SSE server (``_sse_server``) and its handle as a child
(``_bench_server``), the toolkit's load client as the benchmarks run it (``_locust_load``), the
client benchmark's measurement of events/s, CPU and ITL error (``_client_bench``), slow-reader
capacity (``_slow_bench``), open-loop send lag (``_send_lag_bench``), vLLM's client runner
(``_vllm_client``), the client comparison and its targets (``_client_check``), the proxy
benchmark's upstream and client (``_upstream``), the proxy benchmark and its targets
(``_proxy_bench``), tables and JSON (``_render``).
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from harness.benchmarks._client_bench import CLIENTS, ItlResult, run_itl
    from harness.benchmarks._client_check import ClientBench, run_client_bench, vllm_missing
    from harness.benchmarks._common import (
        BenchError,
        BenchInterrupted,
        Machine,
        Verdict,
        interruptible,
    )
    from harness.benchmarks._proxy_bench import (
        PROXY_NAMES,
        ProxyBench,
        ProxyResult,
        ProxyWorkload,
        run_proxy_bench,
    )
    from harness.benchmarks._render import (
        client_cells,
        proxy_cells,
        rich_table,
        skipped_lines,
        targets_met,
        to_json,
        verdict_lines,
    )
    from harness.benchmarks._send_lag_bench import SendLagResult, run_send_lag
    from harness.benchmarks._slow_bench import SlowResult, run_slow

# Loaded on first use, so that the servers the benchmarks start as children (``python -m
# harness.benchmarks._sse_server``, ``._upstream``, ``._vllm_client``) import only themselves.
_LAZY = {
    "verdict_lines": "harness.benchmarks._render",
    "to_json": "harness.benchmarks._render",
    "targets_met": "harness.benchmarks._render",
    "skipped_lines": "harness.benchmarks._render",
    "rich_table": "harness.benchmarks._render",
    "proxy_cells": "harness.benchmarks._render",
    "client_cells": "harness.benchmarks._render",
    "interruptible": "harness.benchmarks._common",
    "CLIENTS": "harness.benchmarks._client_bench",
    "BenchError": "harness.benchmarks._common",
    "BenchInterrupted": "harness.benchmarks._common",
    "ClientBench": "harness.benchmarks._client_check",
    "ItlResult": "harness.benchmarks._client_bench",
    "Machine": "harness.benchmarks._common",
    "PROXY_NAMES": "harness.benchmarks._proxy_bench",
    "ProxyBench": "harness.benchmarks._proxy_bench",
    "ProxyResult": "harness.benchmarks._proxy_bench",
    "ProxyWorkload": "harness.benchmarks._proxy_bench",
    "SendLagResult": "harness.benchmarks._send_lag_bench",
    "SlowResult": "harness.benchmarks._slow_bench",
    "Verdict": "harness.benchmarks._common",
    "run_client_bench": "harness.benchmarks._client_check",
    "run_itl": "harness.benchmarks._client_bench",
    "run_proxy_bench": "harness.benchmarks._proxy_bench",
    "run_send_lag": "harness.benchmarks._send_lag_bench",
    "run_slow": "harness.benchmarks._slow_bench",
    "vllm_missing": "harness.benchmarks._client_check",
}

__all__ = [
    "verdict_lines",
    "to_json",
    "targets_met",
    "skipped_lines",
    "rich_table",
    "proxy_cells",
    "client_cells",
    "interruptible",
    "CLIENTS",
    "BenchError",
    "BenchInterrupted",
    "ClientBench",
    "ItlResult",
    "Machine",
    "PROXY_NAMES",
    "ProxyBench",
    "ProxyResult",
    "ProxyWorkload",
    "SendLagResult",
    "SlowResult",
    "Verdict",
    "run_client_bench",
    "run_itl",
    "run_proxy_bench",
    "run_send_lag",
    "run_slow",
    "vllm_missing",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
