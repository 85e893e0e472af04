"""The Prometheus names a proxy kind serves its own figures under, and the figures a
``/metrics`` answer gives by them.

Each proxy kind declares a tuple of :class:`ProxyFigure` (``ProxyConfigBase.metric_figures``):
which sample name, summed over the samples whose labels match, is which figure, and whether it
is a counter (summarized as its rise over the run) or a gauge (summarized as its peak). The run's
proxy probe reads every hop's metrics through :func:`read_proxy_figures` with the hop's own
declaration, so a kind adds figures without a change to the probe or the analysis (the run
records each hop's declaration in ``run.json``'s ``proxy_hops``; the analysis reads it there).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class ProxyFigure:
    """One figure a proxy serves in its Prometheus exposition.

    ``figure``: its name (a column of ``proxy.parquet``); ``metric``: the sample name as
    exposed (a counter's ``_total`` included; a histogram's ``_sum`` or ``_count``); ``type``:
    ``counter`` (the run reports its rise) or ``gauge`` (its peak); ``labels``: only the samples
    whose labels include these pairs count (all, when empty); ``by_label``: the figure is also
    read once per value of that label, as ``<figure>_<value>``. Samples of the name whose
    labels match are summed.
    """

    figure: str
    metric: str
    type: Literal["counter", "gauge"]
    labels: tuple[tuple[str, str], ...] = ()
    by_label: str | None = None

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a sample with ``labels`` counts toward this figure."""
        return all(labels.get(k) == v for k, v in self.labels)

    def describe(self) -> dict[str, Any]:
        """The declaration as plain data (``run.json``): ``figure``, ``metric``, ``type``,
        ``labels`` (a dict), ``by_label``."""
        return {**asdict(self), "labels": dict(self.labels)}


def read_proxy_figures(text: str, figures: Iterable[ProxyFigure]) -> dict[str, float]:
    """The figures of the Prometheus text exposition ``text`` by the declaration ``figures``:
    each declared figure whose name has at least one matching sample in ``text``, summed, and
    ``<figure>_<value>`` per value of its ``by_label``. A figure with no matching sample is
    absent (the caller decides what absence means: a Prometheus client exports a labelled
    counter's series only once it has counted). Raises ``ValueError`` for text that is not an
    exposition."""
    by_metric: dict[str, list[ProxyFigure]] = {}
    for f in figures:
        by_metric.setdefault(f.metric, []).append(f)
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for f in by_metric.get(sample.name, ()):
                if not f.matches(sample.labels):
                    continue
                value = float(sample.value)
                out[f.figure] = out.get(f.figure, 0.0) + value
                if f.by_label is not None and f.by_label in sample.labels:
                    name = f"{f.figure}_{sample.labels[f.by_label]}"
                    out[name] = out.get(name, 0.0) + value
    return out
