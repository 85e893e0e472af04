"""The accelerator through NVML: what a run records where the machine has no GPU (this one, CI),
or the GPUs and their samples where it has; NVML's readings as rows, and the rows as figures."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pandas as pd

from harness.analysis._accelerator import accelerator_summary
from harness.collectors import gpu_row, open_accelerator
from harness.runfolder import ACCELERATOR_COLUMNS, figure_names, figures
from tests.test_figures import _summary

GIB = 2**30


def test_the_machines_accelerator_is_described_and_sampled_or_its_absence_explained():
    facts, sampler = open_accelerator(interval_s=0.05)
    if not facts["present"]:  # no NVIDIA driver, library or device: this machine and CI
        assert sampler is None
        assert set(facts) == {"present", "reason"}
        assert facts["reason"] and "\n" not in facts["reason"]
        return
    assert sampler is not None and facts["source"] == "nvml" and facts["driver"]
    assert [g["index"] for g in facts["gpus"]] == list(range(len(facts["gpus"])))
    assert all(g["name"] and g["uuid"] and g["memory_total_bytes"] > 0 for g in facts["gpus"])
    sampler.start()
    time.sleep(0.2)
    sampler.stop()
    assert sampler.error is None and sampler.rows
    assert all(list(r) == list(ACCELERATOR_COLUMNS) for r in sampler.rows)


def test_nvml_readings_become_rows():
    memory = SimpleNamespace(total=80 * GIB, used=61 * GIB, free=19 * GIB)
    row = gpu_row(12.5, 1, memory, SimpleNamespace(gpu=97, memory=40))
    assert list(row) == list(ACCELERATOR_COLUMNS)
    assert row == {
        "t": 12.5, "gpu": 1, "memory_used_bytes": 61 * GIB, "memory_total_bytes": 80 * GIB,
        "gpu_utilization_perc": 97.0, "memory_utilization_perc": 40.0,
    }  # fmt: skip
    unsupported = gpu_row(12.5, 1, memory, None)  # a GPU without utilization counters
    assert unsupported["gpu_utilization_perc"] is None
    assert unsupported["memory_utilization_perc"] is None


def test_samples_become_each_gpus_peak_and_the_figures():
    memory = [(0, 10, 40), (0, 30, 80), (1, 20, None), (1, 25, None), (0, 12, 60)]
    samples = pd.DataFrame(
        [
            gpu_row(t, gpu, SimpleNamespace(used=used * GIB, total=80 * GIB),
                    None if util is None else SimpleNamespace(gpu=util, memory=0))
            for t, (gpu, used, util) in enumerate(memory)
        ]
    )  # fmt: skip
    facts = {"present": True, "gpus": [{"index": 0, "name": "H100", "uuid": "GPU-0"}]}
    summary = accelerator_summary(samples, facts)
    assert summary is not None and summary.memory_used_peak_bytes == 30 * GIB
    first, second = summary.gpus
    assert (first.name, first.uuid, first.samples) == ("H100", "GPU-0", 3)
    assert first.memory_used_peak_bytes == 30 * GIB and first.memory_total_bytes == 80 * GIB
    assert first.gpu_utilization_mean_perc == 60.0
    assert second.name is None and second.gpu_utilization_mean_perc is None
    assert accelerator_summary(pd.DataFrame(columns=list(ACCELERATOR_COLUMNS)), facts) is None

    run = _summary()
    assert figures(run)["accelerator.memory_used_peak_bytes"] is None  # no GPU: not measured
    run = run.model_copy(update={"accelerator": summary})
    assert figures(run)["accelerator.memory_used_peak_bytes"] == 30 * GIB
    assert "accelerator.memory_used_peak_bytes" in figure_names(["fast"])
