"""The Prometheus names a target kind serves its figures under, and the figures a ``/metrics``
answer gives by them.

Each target kind declares one :class:`MetricNames` (``TargetConfigBase.metric_names``); the run's
scraper, the idle wait between the runs of a plan and anything else that reads a target's
``/metrics`` go through :func:`read_figures` with the names of the run's target, so a new
engine kind brings its own names and touches no collector. A server the run did not start (a
``url`` target) is read by the names of every registered kind
(:func:`~harness.servers._base.known_metric_names`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields

from prometheus_client.parser import text_string_to_metric_families

SCALAR_FIGURES = (
    "kv_cache_usage",
    "num_requests_running",
    "num_requests_waiting",
    "num_preemptions_total",
    "generation_tokens_total",
)
"""The figures read from one gauge or counter each (the columns of ``server_metrics.parquet``
of the same names)."""
HISTOGRAM_FIGURES = ("ttft_seconds", "itl_seconds", "e2e_seconds")
"""The figures read from a histogram, as ``<figure>_sum`` and ``<figure>_count``."""
SUCCESS_PREFIX = "request_success_"
"""Finished requests are read as ``request_success_<finish reason>`` (one column a reason)."""


@dataclass(frozen=True)
class MetricNames:
    """The Prometheus sample names under which one engine's ``/metrics`` serves the figures
    the run samples. Every field holds the names tried in order (the first one the answer has
    wins: an engine that renamed a metric between versions lists both); ``()``: the engine
    serves no such figure, and it is missing from what is read, never zero.

    - ``kv_cache_usage``: gauge, the fraction (0..1) of the KV cache in use;
    - ``num_requests_running`` / ``num_requests_waiting``: gauges, requests in the running
      batch / queued (preempted ones included, where the engine preempts);
    - ``num_preemptions_total``: counter, preemptions since start;
    - ``generation_tokens_total``: counter, tokens generated since start;
    - ``request_success_total``: counter of finished requests with the finish reason in label
      ``finish_reason_label``; read as ``request_success_<reason>``;
    - ``ttft_seconds``, ``itl_seconds``, ``e2e_seconds``: histograms (seconds) of time to first
      token, inter-token latency and end-to-end latency; read as ``<figure>_sum`` and
      ``<figure>_count``, the base names given here without a suffix.

    Sample names are as exposed (a counter's ``_total`` included). Samples of one name with
    several label sets (several engines, models) are summed.
    """

    kv_cache_usage: tuple[str, ...] = ()
    num_requests_running: tuple[str, ...] = ()
    num_requests_waiting: tuple[str, ...] = ()
    num_preemptions_total: tuple[str, ...] = ()
    generation_tokens_total: tuple[str, ...] = ()
    request_success_total: tuple[str, ...] = ()
    finish_reason_label: str = "finished_reason"
    ttft_seconds: tuple[str, ...] = ()
    itl_seconds: tuple[str, ...] = ()
    e2e_seconds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "finish_reason_label" and (
                not isinstance(value, tuple) or not all(isinstance(n, str) for n in value)
            ):
                raise TypeError(f"MetricNames.{f.name}: a tuple of names, got {value!r}")

    def names_of(self, figure: str) -> tuple[str, ...]:
        """The names tried for ``figure`` (one of :data:`SCALAR_FIGURES`,
        :data:`HISTOGRAM_FIGURES` or ``request_success_total``). Raises ``KeyError`` for
        another figure."""
        if figure not in (*SCALAR_FIGURES, *HISTOGRAM_FIGURES, "request_success_total"):
            raise KeyError(figure)
        names: tuple[str, ...] = getattr(self, figure)
        return names


SGLANG_METRICS = MetricNames(
    kv_cache_usage=("sglang:token_usage",),
    num_requests_running=("sglang:num_running_reqs",),
    num_requests_waiting=("sglang:num_queue_reqs",),
    num_preemptions_total=("sglang:num_retracted_requests_total",),
    generation_tokens_total=("sglang:generation_tokens_total",),
    ttft_seconds=("sglang:time_to_first_token_seconds",),
    itl_seconds=("sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"),
    e2e_seconds=("sglang:e2e_request_latency_seconds",),
)
"""SGLang's names (``python/sglang/srt/metrics/collector.py``, served with
``--enable-metrics``): its KV usage is the token pool's (``token_usage``, 0..1), a preemption is
a retraction. It serves no finished-request counter by reason."""
EXTRA_PRESETS: dict[str, MetricNames] = {"sglang": SGLANG_METRICS}
"""Metric names of engines the toolkit has no kind for, by the name a ``command`` target's
``metrics`` gives (beside every target kind's own: ``_base.metric_presets``)."""


def read_figures(text: str, names: Sequence[MetricNames]) -> dict[str, float]:
    """The figures of a Prometheus text exposition ``text`` by ``names`` (several: the names of
    each are tried in turn, so one call reads whichever of those engines answered):
    :data:`SCALAR_FIGURES` by name, :data:`HISTOGRAM_FIGURES` as ``<figure>_sum`` and
    ``<figure>_count``, and ``request_success_<reason>``. A figure the answer lacks is absent.
    Raises ``ValueError`` for text that is not an exposition."""
    samples: dict[str, float] = {}
    success: dict[str, dict[str, float]] = {}  # counter name -> reason -> count
    counters = {n: m.finish_reason_label for m in names for n in m.request_success_total}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            value = float(sample.value)
            if sample.name in counters:
                reason = sample.labels.get(counters[sample.name], "")
                per_reason = success.setdefault(sample.name, {})
                per_reason[reason] = per_reason.get(reason, 0.0) + value
            elif not sample.name.endswith("_bucket"):
                samples[sample.name] = samples.get(sample.name, 0.0) + value
    out: dict[str, float] = {}
    for figure in SCALAR_FIGURES:
        if (found := _first(samples, (n for m in names for n in m.names_of(figure)))) is not None:
            out[figure] = found
    for figure in HISTOGRAM_FIGURES:
        for suffix in ("_sum", "_count"):
            candidates = (n + suffix for m in names for n in m.names_of(figure))
            if (found := _first(samples, candidates)) is not None:
                out[figure + suffix] = found
    for name in (n for m in names for n in m.request_success_total):
        if name in success:
            out.update({SUCCESS_PREFIX + r: v for r, v in success[name].items()})
            break
    return out


def _first(samples: dict[str, float], candidates: Iterable[str]) -> float | None:
    for name in candidates:
        if name in samples:
            return samples[name]
    return None


def figures_read(names: Sequence[MetricNames]) -> list[str]:
    """The figures ``names`` can give (scalars, then ``<histogram>_count``), in the order of
    :data:`SCALAR_FIGURES` and :data:`HISTOGRAM_FIGURES`."""
    scalars = [f for f in SCALAR_FIGURES if any(m.names_of(f) for m in names)]
    return scalars + [f"{h}_count" for h in HISTOGRAM_FIGURES if any(m.names_of(h) for m in names)]
