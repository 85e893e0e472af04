"""The accelerator's figures: each GPU's peak memory used and mean utilization over the run, from
its NVML samples (``accelerator.parquet``, ``harness.collectors._accelerator``)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from harness.runfolder import AcceleratorSummary, GpuSummary


def accelerator_summary(
    samples: pd.DataFrame, facts: dict[str, Any] | None
) -> AcceleratorSummary | None:
    """The GPUs' figures from ``samples`` (rows of ``ACCELERATOR_COLUMNS``), named by ``facts``
    (``run.json``'s ``accelerator``: ``gpus`` with ``index``, ``name``, ``uuid``); ``None``
    without samples (no GPU, or NVML failed before the first one). Sizes in bytes, utilization
    in percent."""
    if not len(samples):
        return None
    described = {g.get("index"): g for g in (facts or {}).get("gpus", []) if isinstance(g, dict)}
    gpus = []
    for index in sorted(int(i) for i in samples["gpu"].unique()):
        rows = samples[samples["gpu"] == index]
        known = described.get(index, {})
        utilization = rows["gpu_utilization_perc"].dropna()
        gpus.append(
            GpuSummary(
                index=index,
                name=known.get("name"),
                uuid=known.get("uuid"),
                memory_total_bytes=int(rows["memory_total_bytes"].max()),
                memory_used_peak_bytes=int(rows["memory_used_bytes"].max()),
                gpu_utilization_mean_perc=float(utilization.mean()) if len(utilization) else None,
                samples=len(rows),
            )
        )
    peak = max(g.memory_used_peak_bytes for g in gpus)
    return AcceleratorSummary(memory_used_peak_bytes=peak, gpus=gpus)
