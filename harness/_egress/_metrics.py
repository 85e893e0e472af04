"""Prometheus metrics of the egress buffer, in a private registry, names ``zerowindow_egress_*``.

The registry is private so that several proxies (and the engine emulator) can share one
process. It is served on the proxy's separate metrics listener (``EgressConfig.metrics_port``),
never on the proxied listener, which forwards every path (``/metrics`` included) upstream.

Definitions (times in seconds, sizes in bytes):

- a **stream** is one proxied response, from the request being sent upstream until its last
  byte was accepted by the client's socket, or it was cut, or it failed;
- a **stall** is a period during which the client owes bytes (the proxy wrote more for it
  than it acknowledged) and acknowledges none (``tcpi_bytes_acked``, see ``_watchdog``), seen
  by the watchdog for at least one tick (``tick_s``); it ends when the client acknowledges
  bytes again or the connection is cut;
- a **cut** ends a client connection abortively with a TCP RST; its reasons are
  ``stall_timeout`` (a stall reached ``stall_timeout_s``) and ``overflow`` (the stream's
  buffer was full with ``overflow="cut"``);
- an **upstream abort** is the proxy closing an upstream connection before the response
  ended, so that the engine aborts the request; reasons: ``stall_timeout``, ``overflow``,
  ``client_closed`` (the client went away), ``shutdown``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric

PREFIX = "zerowindow_egress"
CUT_REASONS = ("stall_timeout", "overflow")
ABORT_REASONS = ("stall_timeout", "overflow", "client_closed", "shutdown")
REJECT_REASONS = (
    "too_many_connections",  # 503
    "header_too_large",  # 431
    "body_too_large",  # 413
    "header_timeout",  # 408
    "body_timeout",  # 408
    "bad_request",  # 400, 405
)
UPSTREAM_ERRORS = ("connect", "before_response", "mid_stream")
STALL_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0, 30.0, 60.0)
BUFFER_BUCKETS_BYTES = tuple(float(1 << n) for n in range(10, 25, 2))  # 1 KiB .. 16 MiB

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format served at ``/metrics``."""


class _LiveGauges:
    """Gauges read at scrape time from the proxy's live state (no bookkeeping per write)."""

    def __init__(self, buffered_bytes: Callable[[], int], connections: Callable[[], int]) -> None:
        self._buffered_bytes = buffered_bytes
        self._connections = connections

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            f"{PREFIX}_buffered_bytes",
            "Response bytes held in host memory for clients, summed over connections "
            "(bytes the client sockets have not accepted yet).",
            value=self._buffered_bytes(),
        )
        yield GaugeMetricFamily(
            f"{PREFIX}_connections",
            "Open client connections (streaming, idle keep-alive or sending a request).",
            value=self._connections(),
        )


class EgressMetrics:
    """The proxy's metrics in a private ``CollectorRegistry``.

    ``buffered_bytes`` and ``connections`` are callables read at scrape time.
    """

    def __init__(self, *, buffered_bytes: Callable[[], int], connections: Callable[[], int]):
        self.registry = CollectorRegistry(auto_describe=True)
        reg = self.registry
        self.active_streams = Gauge(
            f"{PREFIX}_active_streams",
            "Responses in progress: sent upstream and not yet fully accepted by the client's "
            "socket, cut or failed.",
            registry=reg,
        )
        self.requests = Counter(
            f"{PREFIX}_requests", "Requests forwarded to the upstream.", registry=reg
        )
        self.stalls = Counter(
            f"{PREFIX}_stalls",
            "Stalls: periods in which a client acknowledged no byte while it owed bytes "
            "(at least one watchdog tick long).",
            registry=reg,
        )
        self.stall_duration = Histogram(
            f"{PREFIX}_stall_duration_seconds",
            "Durations of stalls, observed when they end (progress or cut).",
            buckets=STALL_BUCKETS_S,
            registry=reg,
        )
        cuts = Counter(
            f"{PREFIX}_cuts",
            "Client connections reset (TCP RST) by the proxy, by reason.",
            ["reason"],
            registry=reg,
        )
        self.cuts = {r: cuts.labels(r) for r in CUT_REASONS}
        aborts = Counter(
            f"{PREFIX}_upstream_aborts",
            "Upstream connections closed by the proxy before the response ended (the engine "
            "aborts the request), by reason.",
            ["reason"],
            registry=reg,
        )
        self.upstream_aborts = {r: aborts.labels(r) for r in ABORT_REASONS}
        errors = Counter(
            f"{PREFIX}_upstream_errors",
            "Upstream failures: connect failed or timed out, connection closed or malformed "
            "response before the response head, or during the body.",
            ["stage"],
            registry=reg,
        )
        self.upstream_errors = {r: errors.labels(r) for r in UPSTREAM_ERRORS}
        rejected = Counter(
            f"{PREFIX}_rejected",
            "Client requests or connections refused by the proxy's limits, by reason.",
            ["reason"],
            registry=reg,
        )
        self.rejected = {r: rejected.labels(r) for r in REJECT_REASONS}
        self.stream_peak_buffered = Histogram(
            f"{PREFIX}_stream_peak_buffered_bytes",
            "Largest number of bytes buffered for one stream, observed when it ends.",
            buckets=BUFFER_BUCKETS_BYTES,
            registry=reg,
        )
        reg.register(_LiveGauges(buffered_bytes, connections))
        ProcessCollector(namespace=PREFIX, registry=reg)

    def render(self) -> bytes:
        """The registry in Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)
