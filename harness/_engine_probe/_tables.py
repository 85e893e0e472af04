"""The engine's own tables, ``engine_steps.parquet`` and ``engine_requests.parquet``, written by
the engine process (vLLM through the probe, the emulator natively) into the run folder.

Columns are listed in ``results/README.md``; times are CLOCK_MONOTONIC seconds
(``time.monotonic()``), the clock of the client records, so that a request's engine and client
times compare directly on one machine. This module needs only the standard library and
pyarrow: it runs inside the engine's interpreter.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

ENGINE_DIR_ENV = "ZEROWINDOW_ENGINE_DIR"
"""Environment variable naming the folder the engine writes its tables into (the run folder);
unset, the engine writes none."""

PROBE_ERROR = "zerowindow engine probe"
"""Words that begin every error the probe raises or reports, for the harness to find in the
engine's log."""

STEPS_FILE = "engine_steps.parquet"
REQUESTS_FILE = "engine_requests.parquet"
STATUS_FILE = "engine_probe.json"

STEP_SCHEMA = pa.schema([
    ("t", pa.float64()),
    ("step", pa.int64()),
    ("kv_cache_usage", pa.float64()),
    ("num_requests_running", pa.int64()),
    ("num_requests_waiting", pa.int64()),
    ("num_preemptions_total", pa.int64()),
    ("num_scheduled_tokens", pa.int64()),
])  # fmt: skip

REQUEST_SCHEMA = pa.schema([
    ("engine_request_id", pa.string()),
    ("t_arrival", pa.float64()),
    ("t_first_scheduled", pa.float64()),
    ("t_first_token", pa.float64()),
    ("t_generation_end", pa.float64()),
    ("t_kv_freed", pa.float64()),
    ("finish_reason", pa.string()),
    ("prompt_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("kv_blocks_peak", pa.int64()),
    ("kv_blocks_freed", pa.int64()),
    ("preempted_at", pa.list_(pa.float64())),
    ("resumed_at", pa.list_(pa.float64())),
])  # fmt: skip


class _Table:
    """Rows buffered column by column; each flush writes them as one complete Parquet file,
    ``<path>/part-NNNNNN.parquet``, so that ``path`` is a Parquet dataset (a folder that
    ``pandas.read_parquet`` reads as one table) and every flushed row survives an engine that
    is killed (vLLM's API server SIGKILLs its engine core on shutdown). A part is written under
    a name beginning with ``.`` (which readers skip) and then renamed."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.columns: dict[str, list[Any]] = {name: [] for name in schema.names}
        self._parts = 0

    def append(self, row: dict[str, Any]) -> None:
        for name, values in self.columns.items():
            values.append(row.get(name))

    def flush(self, *, always: bool = False) -> None:
        """Write the buffered rows as a new part (with ``always``, even none: the table then
        exists, with its columns, when the engine saw nothing)."""
        if not self.columns[self.schema.names[0]] and not (always and self._parts == 0):
            return
        table = pa.Table.from_pydict(self.columns, schema=self.schema)
        self.path.mkdir(exist_ok=True)
        name = f"part-{self._parts:06d}.parquet"
        tmp = self.path / f".{name}"
        pq.write_table(table, tmp)
        tmp.replace(self.path / name)
        self._parts += 1
        for values in self.columns.values():
            values.clear()


class EngineTables:
    """The two engine tables of one engine process, written into ``out_dir``.

    :meth:`step` and :meth:`request` buffer rows (a few list appends: cheap enough for every
    engine step); every ``flush_interval_s`` (checked at each step) the buffers are written as
    a new part of each table's folder (see :class:`_Table`), so that a long run does not grow
    in memory and a killed engine loses at most the rows of the last interval. The harness
    compacts each folder into a single file after the engine stopped
    (:func:`compact_dataset`). Raises ``OSError`` when ``out_dir`` is not writable.
    """

    def __init__(self, out_dir: str | os.PathLike[str], *, flush_interval_s: float = 2.0) -> None:
        out = Path(out_dir)
        self.steps = _Table(out / STEPS_FILE, STEP_SCHEMA)
        self.requests = _Table(out / REQUESTS_FILE, REQUEST_SCHEMA)
        self.flush_interval_s = flush_interval_s
        self._next_flush = time.monotonic() + flush_interval_s
        self._step = 0
        self.closed = False

    def step(
        self,
        t: float,
        *,
        kv_cache_usage: float,
        running: int,
        waiting: int,
        preemptions_total: int,
        scheduled_tokens: int,
    ) -> None:
        """One engine step ending at ``t`` (monotonic s); KV usage as a 0..1 fraction."""
        c = self.steps.columns
        c["t"].append(t)
        c["step"].append(self._step)
        c["kv_cache_usage"].append(kv_cache_usage)
        c["num_requests_running"].append(running)
        c["num_requests_waiting"].append(waiting)
        c["num_preemptions_total"].append(preemptions_total)
        c["num_scheduled_tokens"].append(scheduled_tokens)
        self._step += 1
        if t >= self._next_flush:
            self.flush()
            self._next_flush = t + self.flush_interval_s

    def request(self, row: dict[str, Any]) -> None:
        """One request's row (keys: the columns of ``REQUEST_SCHEMA``; a missing key is null)."""
        self.requests.append(row)

    def flush(self) -> None:
        """Write the buffered rows of both tables."""
        self.steps.flush()
        self.requests.flush()

    def close(self) -> None:
        """Write what is buffered (both tables exist afterwards); a second call does nothing."""
        if self.closed:
            return
        self.closed = True
        self.steps.flush(always=True)
        self.requests.flush(always=True)


def compact_dataset(path: Path) -> None:
    """Replace the Parquet dataset folder ``path`` (the parts an engine wrote) by a single
    Parquet file of the same name holding all its rows in order. Does nothing when ``path`` is
    not a folder. Raises ``OSError`` or ``pyarrow.ArrowInvalid`` for unreadable parts."""
    if not path.is_dir():
        return
    parts = sorted(p for p in path.glob("part-*.parquet"))
    tables = [pq.read_table(p) for p in parts]
    tmp = path.with_name(f".{path.name}.compact")
    if tables:
        pq.write_table(pa.concat_tables(tables), tmp)
    for p in path.iterdir():
        p.unlink()
    path.rmdir()
    if tables:
        tmp.replace(path)


def write_status(out_dir: str | os.PathLike[str], **fields: Any) -> None:
    """Write ``engine_probe.json`` (``engine``, ``status``, ``base_class``, ``engine_version``,
    ``reason``...) with this process's ``pid``, atomically (a reader never sees half a file)."""
    path = Path(out_dir) / STATUS_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**fields, "pid": os.getpid()}, indent=2) + "\n")
    tmp.replace(path)
