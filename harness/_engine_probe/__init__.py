"""The engine's side of the run: tables an engine writes about itself (every step's KV usage
and queue lengths, every request's life inside the engine), and the probe that makes vLLM write
them (``harness._engine_probe._vllm_scheduler``, loaded by vLLM through ``--scheduler-cls``).

Everything here runs inside the engine's process and needs only the standard library and
pyarrow (and vLLM, for the probe): no other part of the harness is imported.
"""

from harness._engine_probe._tables import (
    ENGINE_DIR_ENV,
    FLUSH_REQUEST_FILE,
    FLUSHED_FILE,
    PROBE_ERROR,
    REQUEST_SCHEMA,
    REQUESTS_FILE,
    STATUS_FILE,
    STEP_SCHEMA,
    STEPS_FILE,
    EngineTables,
    compact_dataset,
    read_status,
    write_status,
)

__all__ = [
    "ENGINE_DIR_ENV",
    "PROBE_ERROR",
    "FLUSH_REQUEST_FILE",
    "FLUSHED_FILE",
    "REQUESTS_FILE",
    "REQUEST_SCHEMA",
    "STATUS_FILE",
    "STEPS_FILE",
    "STEP_SCHEMA",
    "EngineTables",
    "compact_dataset",
    "read_status",
    "write_status",
]
