"""The engine's own tables, brought into the run folder at the end of a run.

An engine that writes its tables (vLLM with the engine probe, the emulator;
``harness._engine_probe``) writes them into the folder named by ``ZEROWINDOW_ENGINE_DIR``: the
run folder when the run started the engine, else the folder of whoever started it (the
comparison's folder; for a ``url`` target, the ``engine_dir`` the user names). Either way the
run folder ends with its own single-file ``engine_steps.parquet`` and
``engine_requests.parquet``: compacted from the parts the engine wrote, or the slice of a
shared engine's tables that falls within the run.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from harness._engine_probe import (
    FLUSH_REQUEST_FILE,
    FLUSHED_FILE,
    REQUEST_SCHEMA,
    REQUESTS_FILE,
    STEP_SCHEMA,
    STEPS_FILE,
    compact_dataset,
)

FLUSH_WAIT_S = 2.5
"""How long to wait at most, after the load ended, for a running engine to write its last rows
(it writes every 2 s: ``EngineTables.flush_interval_s``); an engine that says up to when it
has written (``FLUSHED_FILE``) is waited for only that long."""


def wait_flushed(engine_dir: Path, t_end: float, *, timeout_s: float = FLUSH_WAIT_S) -> float:
    """Wait until the engine writing into ``engine_dir`` has written every row up to ``t_end``
    (monotonic s; its ``FLUSHED_FILE`` says up to when), or ``timeout_s``; return the seconds
    waited."""
    t0 = time.monotonic()
    marker = engine_dir / FLUSHED_FILE
    try:  # ask for a flush now; an engine that does not look flushes at its interval
        (engine_dir / FLUSH_REQUEST_FILE).touch()
    except OSError:
        pass
    while (waited := time.monotonic() - t0) < timeout_s:
        try:
            if float(marker.read_text()) >= t_end:
                return waited
        except (OSError, ValueError):  # an engine that writes no marker: the whole wait
            pass
        time.sleep(0.05)
    return time.monotonic() - t0


def _read(path: Path, schema: pa.Schema) -> pd.DataFrame:
    """A table an engine wrote (a folder of parts or one file), empty if there is none."""
    if not path.exists():
        return schema.empty_table().to_pandas()
    return pd.read_parquet(path)


def _write(frame: pd.DataFrame, path: Path, schema: pa.Schema) -> None:
    pq.write_table(pa.Table.from_pandas(frame, schema=schema, preserve_index=False), path)


def collect_engine_tables(
    run_dir: Path, engine_dir: Path | None, *, t_start: float, t_end: float | None = None
) -> str | None:
    """Leave single-file engine tables in ``run_dir``; return why not, or ``None``.

    ``engine_dir`` is where the engine wrote (``None``: it wrote nothing). When it is
    ``run_dir``, the run started the engine and has stopped it: its parts are compacted.
    Otherwise the engine is shared and still running: once it has written its rows up to
    ``t_end`` (default: now; :func:`wait_flushed`), the steps from ``t_start`` (monotonic s) on
    and the requests that arrived from then on are copied.
    """
    if engine_dir is None:
        return None
    steps_path, requests_path = engine_dir / STEPS_FILE, engine_dir / REQUESTS_FILE
    if not steps_path.exists() and not requests_path.exists():
        return f"the engine wrote no tables in {engine_dir}"
    try:
        if engine_dir.resolve() == run_dir.resolve():
            compact_dataset(steps_path)
            compact_dataset(requests_path)
            for name in (FLUSHED_FILE, FLUSH_REQUEST_FILE):  # the engine has stopped
                (engine_dir / name).unlink(missing_ok=True)
            return None
        wait_flushed(engine_dir, time.monotonic() if t_end is None else t_end)
        steps = _read(steps_path, STEP_SCHEMA)
        requests = _read(requests_path, REQUEST_SCHEMA)
        _write(steps[steps["t"] >= t_start], run_dir / STEPS_FILE, STEP_SCHEMA)
        _write(requests[requests["t_arrival"] >= t_start], run_dir / REQUESTS_FILE, REQUEST_SCHEMA)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for damaged parts
        return f"the engine's tables in {engine_dir} could not be read: {exc}"
    return None
