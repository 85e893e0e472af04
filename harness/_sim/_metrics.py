"""Prometheus metrics of the engine emulator, under vLLM's names, labels and buckets.

Names, help texts, label sets (``model_name``, ``engine``; ``finished_reason`` on
``vllm:request_success``) and histogram buckets are copied from vLLM 0.32's
``vllm/v1/metrics/loggers.py`` (``PrometheusStatLogger``) and
``vllm/v1/metrics/buckets.py``, so collectors and verdicts written for vLLM read the
emulator unchanged. prometheus_client appends ``_total`` to counters on exposition
(``vllm:num_preemptions`` is scraped as ``vllm:num_preemptions_total``), as for vLLM.

``vllm:num_requests_running`` counts the requests in the scheduler's running batch, as
vLLM's ``len(scheduler.running)`` does. With ``kv_release="on_delivery"`` a request whose
generation has ended but whose response is still undelivered is *not* running (it takes no
batch slot and computes nothing) and *not* waiting; it only keeps
``vllm:kv_cache_usage_perc`` up. ``vllm:num_requests_waiting`` includes preempted requests.

The prefix-cache counters count, as vLLM's ``PrefixCacheStats`` (vllm/v1/metrics/stats.py), a
request's tokens (queries) and its cached prefix (hits) at its first admission (not after a
preemption); nothing with prefix caching off.

Two extra gauges, under a ``sim:`` prefix that vLLM does not use, expose what the emulator
alone knows: requests whose generation ended but whose KV blocks wait for their response to
be delivered (``kv_release="on_delivery"``), and those blocks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

# vllm/v1/metrics/buckets.py
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
"""vLLM's ``FINISH_REASON_STRINGS`` (``vllm/v1/engine/__init__.py``); every label value
is created up front, as vLLM does."""

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Content type of the text exposition format served at ``/metrics``."""


class LightHistogram:
    """A Prometheus histogram of one label set, observed without locks.

    prometheus_client's ``Histogram.observe`` takes two locks per call; the emulator
    observes inter-token latency once per token and runs in one event loop, so its
    histograms are plain counters exposed by ``_HistogramCollector`` (same samples:
    ``_bucket{le=...}`` cumulative, ``_count``, ``_sum``; no ``_created``).
    """

    __slots__ = ("name", "documentation", "bounds", "counts", "sum")

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # last: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        """Record one value (in the histogram's unit, seconds here)."""
        self.counts[bisect_left(self.bounds, value)] += 1  # buckets are le (inclusive)
        self.sum += value


class _HistogramCollector:
    """Exposes ``LightHistogram``s of one label set through a registry."""

    def __init__(self, histograms: list[LightHistogram], labels: dict[str, str]) -> None:
        self._histograms = histograms
        self._labels = labels

    def collect(self) -> Iterator[Metric]:
        names = list(self._labels)
        values = list(self._labels.values())
        for h in self._histograms:
            family = HistogramMetricFamily(h.name, h.documentation, labels=names)
            buckets = []
            total = 0
            for bound, count in zip(h.bounds, h.counts, strict=False):
                total += count
                buckets.append((floatToGoString(bound), total))
            buckets.append(("+Inf", total + h.counts[-1]))
            family.add_metric(values, buckets, sum_value=h.sum)
            yield family


class SimMetrics:
    """The emulator's metrics in a private registry (several emulators may share a process).

    Times are in seconds; token counts in tokens; ``kv_cache_usage_perc`` is a fraction 0..1
    (despite its name, as in vLLM).
    """

    def __init__(self, *, model_name: str, engine: str = "0") -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ["model_name", "engine"]
        values = (model_name, engine)
        reg = self.registry

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, labels, registry=reg).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, labels, registry=reg).labels(*values)

        histograms: list[LightHistogram] = []

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> LightHistogram:
            h = LightHistogram(name, doc, buckets)
            histograms.append(h)
            return h

        self.num_requests_running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.num_requests_waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_cache_usage_perc = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.num_preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            labels + ["finished_reason"],
            registry=reg,
        )
        self.request_success = {r: success.labels(*values, r) for r in FINISH_REASONS}
        self.time_to_first_token = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e_request_latency = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.request_queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.num_requests_held = gauge(
            "sim:num_requests_held_for_delivery",
            "Requests whose generation ended and whose KV blocks wait for the response to "
            "leave the server socket (kv_release=on_delivery).",
        )
        self.kv_blocks_held = gauge(
            "sim:kv_blocks_held_for_delivery",
            "KV blocks owned by requests held for delivery.",
        )
        reg.register(_HistogramCollector(histograms, dict(zip(labels, values, strict=True))))

    def render(self) -> bytes:
        """The registry in Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)
