"""The accelerator: the machine's NVIDIA GPUs through NVML (PyPI ``nvidia-ml-py``, module
``pynvml``), described once at the start of a run and sampled while it runs.

:func:`open_accelerator` gives ``run.json``'s ``accelerator`` and, where NVML starts and finds
GPUs, an :class:`AcceleratorSampler` that reads each GPU's memory and utilization every
interval. Where NVML does not start (no library, no driver) or finds no GPU, the run says why
and samples nothing. NVML never fails a run: an error while sampling ends the sampling and is
kept as :attr:`AcceleratorSampler.error`.

The facts and their units come from the NVML API reference (docs.nvidia.com/deploy/nvml-api):
``nvmlDeviceGetMemoryInfo`` (``nvmlMemory_t``: ``total``, ``used``, ``free``, bytes of device
memory, every process's), ``nvmlDeviceGetUtilizationRates`` (``nvmlUtilization_t``: ``gpu``,
percent of the past sample period in which a kernel ran; ``memory``, percent in which device
memory was read or written), ``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``,
``nvmlSystemGetDriverVersion``. NVML numbers the GPUs of the whole machine, whatever
``CUDA_VISIBLE_DEVICES`` hides from the target.
"""

from __future__ import annotations

import time
from typing import Any

from harness.collectors._collectors import Sampler


def _text(value: str | bytes) -> str:
    """NVML's strings (bytes from older ``pynvml`` versions) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_row(t: float, index: int, memory: Any, utilization: Any | None) -> dict[str, Any]:
    """One row of ``accelerator.parquet`` (``harness.runfolder.ACCELERATOR_COLUMNS``) from one
    GPU's readings at monotonic time ``t``: ``memory`` as NVML's ``nvmlMemory_t`` (``used``
    and ``total``, bytes), ``utilization`` as its ``nvmlUtilization_t`` (``gpu`` and
    ``memory``, percent) or ``None`` where the GPU does not report it."""
    return {
        "t": t,
        "gpu": index,
        "memory_used_bytes": int(memory.used),
        "memory_total_bytes": int(memory.total),
        "gpu_utilization_perc": None if utilization is None else float(utilization.gpu),
        "memory_utilization_perc": None if utilization is None else float(utilization.memory),
    }


class AcceleratorSampler(Sampler):
    """Samples the GPUs behind NVML ``handles`` (one per GPU, by NVML index) every
    ``interval_s`` seconds into ``rows`` (:func:`gpu_row`). A GPU that answers
    ``NVMLError_NotSupported`` for utilization gets ``None`` there from then on; any other NVML
    error ends the sampling, with ``error`` saying why (the rows so far are kept). :meth:`stop`
    also shuts NVML down (it was started by :func:`open_accelerator`)."""

    def __init__(self, nvml: Any, handles: list[Any], *, interval_s: float) -> None:
        super().__init__(interval_s, "zw-accelerator")
        self._nvml = nvml
        self._handles = handles
        self._utilization = [True] * len(handles)  # False once a GPU said it does not report it
        self.rows: list[dict[str, Any]] = []
        self.error: str | None = None
        self._shut = False

    def _read_utilization(self, i: int) -> Any | None:
        if not self._utilization[i]:
            return None
        try:
            return self._nvml.nvmlDeviceGetUtilizationRates(self._handles[i])
        except self._nvml.NVMLError_NotSupported:
            self._utilization[i] = False
            return None

    def sample(self) -> None:
        t = time.monotonic()
        try:
            rows = [
                gpu_row(t, i, self._nvml.nvmlDeviceGetMemoryInfo(h), self._read_utilization(i))
                for i, h in enumerate(self._handles)
            ]
        except Exception as exc:  # noqa: BLE001 - NVML trouble ends sampling, never the run
            self.error = f"accelerator sampling stopped: NVML {type(exc).__name__}: {exc}"
            self._stop_event.set()
            return
        self.rows.extend(rows)

    def stop(self) -> None:
        super().stop()
        if not self._shut:
            self._shut = True
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - nothing is left to measure
                pass


def _describe(nvml: Any) -> tuple[dict[str, Any], list[Any]]:
    """``run.json``'s ``accelerator`` for an initialised NVML, and a handle per GPU."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    if not handles:
        return {"present": False, "reason": "NVML started and found no GPU"}, []
    gpus = [
        {
            "index": i,
            "name": _text(nvml.nvmlDeviceGetName(h)),
            "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
            "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total),
        }
        for i, h in enumerate(handles)
    ]
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    return {"present": True, "source": "nvml", "driver": driver, "gpus": gpus}, handles


def open_accelerator(*, interval_s: float) -> tuple[dict[str, Any], AcceleratorSampler | None]:
    """The machine's accelerator for ``run.json`` and a sampler of it (not started), or no
    sampler where there is nothing to sample. Never raises.

    With GPUs: ``{"present": true, "source": "nvml", "driver": ..., "gpus": [{"index",
    "name", "uuid", "memory_total_bytes"}]}``; without: ``{"present": false, "reason": ...}``,
    the reason in one line (``nvidia-ml-py`` not installed, NVML's own error from
    ``nvmlInit``, such as "NVML Shared Library Not Found" where there is no NVIDIA driver, or
    no GPU found)."""
    try:
        import pynvml
    except ImportError:
        return {"present": False, "reason": "nvidia-ml-py (pynvml) is not installed"}, None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_*, or a broken library
        return {"present": False, "reason": f"nvmlInit: {exc}"}, None
    try:
        facts, handles = _describe(pynvml)
    except Exception as exc:  # noqa: BLE001
        facts, handles = {"present": False, "reason": f"NVML: {type(exc).__name__}: {exc}"}, []
    if not handles:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        return facts, None
    return facts, AcceleratorSampler(pynvml, handles, interval_s=interval_s)
