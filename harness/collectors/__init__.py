"""Collectors: what the run samples while the load runs: the server's ``/metrics`` (read by the
run's target, with its kind's own metric names), its TCP sockets (``inet_diag``), the
proxy's memory, buffers and sockets, and the machine's GPUs (NVML)."""

from harness.collectors._accelerator import AcceleratorSampler, gpu_row, open_accelerator
from harness.collectors._collectors import (
    SOCKET_COLUMNS,
    MetricsReader,
    MetricsScraper,
    Sampler,
    SocketSampler,
)
from harness.collectors._engine_tables import collect_engine_tables
from harness.collectors._proxy_probe import (
    ProbedHop,
    ProxyProbe,
    SocketTables,
    procs_rss_bytes,
    tree_rss_bytes,
)

__all__ = [
    "AcceleratorSampler",
    "gpu_row",
    "open_accelerator",
    "procs_rss_bytes",
    "SOCKET_COLUMNS",
    "MetricsReader",
    "MetricsScraper",
    "ProbedHop",
    "ProxyProbe",
    "Sampler",
    "collect_engine_tables",
    "SocketSampler",
    "SocketTables",
    "tree_rss_bytes",
]
