"""The engine's own tables, ``engine_steps.parquet`` and ``engine_requests.parquet``, written by
the engine process (vLLM through the probe, the emulator natively) into the run folder.

Columns are listed in ``docs/run-folder.md``; times are CLOCK_MONOTONIC seconds
(``time.monotonic()``), the clock of the client records, so that a request's engine and client
times compare directly on one machine. This module needs only the standard library and
pyarrow: it runs inside the engine's interpreter.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
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
FLUSHED_FILE = "engine_flushed"
"""Beside the tables: the monotonic time (s, text) up to which every buffered row has been
written, renewed by each flush, so a reader of a running engine's tables knows when they
cover a moment (``harness.collectors.collect_engine_tables``)."""
FLUSH_REQUEST_FILE = "engine_flush_request"
"""Beside the tables: created by a reader that wants the rows up to now (the harness at the end
of a run against a running engine); the flushing thread, which looks for it every
:data:`FLUSH_POLL_S`, removes it and flushes at once instead of at the next interval."""
FLUSH_POLL_S = 0.05

STEP_SCHEMA = pa.schema([
    ("t", pa.float64()),
    ("step", pa.int64()),
    ("kv_cache_usage", pa.float64()),
    ("num_requests_running", pa.int64()),
    ("num_requests_waiting", pa.int64()),
    ("num_preemptions_total", pa.int64()),
    ("num_scheduled_tokens", pa.int64()),
    # KV blocks held by requests (what kv_cache_usage is a fraction of) and free blocks that
    # still carry a prefix-cache hash (reusable, evictable; null where the engine has no
    # prefix cache to count)
    ("kv_blocks_in_use", pa.int64()),
    ("kv_blocks_cached_free", pa.int64()),
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
    # prompt tokens served from the prefix cache when first scheduled (null: not known)
    ("prompt_cached_tokens", pa.int64()),
    ("output_tokens", pa.int64()),
    ("kv_blocks_peak", pa.int64()),
    ("kv_blocks_freed", pa.int64()),
    ("preempted_at", pa.list_(pa.float64())),
    ("resumed_at", pa.list_(pa.float64())),
    # spans in which generation waited for the server's send path (a single-context engine
    # that hands tokens to a bounded queue; empty for engines that never wait)
    ("send_blocked_at", pa.list_(pa.float64())),
    ("send_unblocked_at", pa.list_(pa.float64())),
])  # fmt: skip


class _Table:
    """Rows buffered column by column; each flush writes them as one complete Parquet file,
    ``<path>/part-NNNNNN.parquet``, so that ``path`` is a Parquet dataset (a folder that
    ``pandas.read_parquet`` reads as one table) and every flushed row survives an engine that
    is killed (vLLM's API server SIGKILLs its engine core on shutdown). A part is written under
    a name beginning with ``.`` (which readers skip) and then renamed. Not thread-safe: the
    owner locks."""

    def __init__(self, path: Path, schema: pa.Schema) -> None:
        self.path = path
        self.schema = schema
        self.columns: dict[str, list[Any]] = self._empty()
        self._parts = 0

    def _empty(self) -> dict[str, list[Any]]:
        return {name: [] for name in self.schema.names}

    def append(self, row: dict[str, Any]) -> None:
        for name, values in self.columns.items():
            values.append(row.get(name))

    def take(self) -> dict[str, list[Any]]:
        """The buffered rows, leaving the buffer empty."""
        taken, self.columns = self.columns, self._empty()
        return taken

    def write(self, columns: dict[str, list[Any]], *, always: bool = False) -> None:
        """Write ``columns`` as a new part (with ``always``, even no rows when no part exists
        yet: the table then exists, with its columns, when the engine saw nothing)."""
        if not columns[self.schema.names[0]] and not (always and self._parts == 0):
            return
        table = pa.Table.from_pydict(columns, schema=self.schema)
        self.path.mkdir(exist_ok=True)
        name = f"part-{self._parts:06d}.parquet"
        tmp = self.path / f".{name}"
        pq.write_table(table, tmp, compression="none")  # 10x cheaper; compaction compresses
        tmp.replace(self.path / name)
        self._parts += 1


class EngineTables:
    """The two engine tables of one engine process, written into ``out_dir``.

    :meth:`step` and :meth:`request` buffer rows (a lock and a few list appends: cheap enough
    for every engine step); a background thread writes the buffers every ``flush_interval_s``
    as a new part of each table's folder (see :class:`_Table`), so that a long run does not
    grow in memory, an idle engine's last rows reach the disk, and a killed engine loses at
    most the rows of the last interval. The harness compacts each folder into a single file
    after the engine stopped (:func:`compact_dataset`). Raises ``OSError`` when ``out_dir``
    is not writable. ``on_error`` is called (from the flushing thread) with an exception a
    write raised; flushing then stops. ``on_flush`` is called with the tables after each
    flush (``flush_s``: CPU seconds spent writing so far).
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        flush_interval_s: float = 2.0,
        on_error: Callable[[BaseException], None] | None = None,
        on_flush: Callable[[EngineTables], None] | None = None,
    ) -> None:
        out = Path(out_dir)
        if not out.is_dir():
            raise OSError(f"{out}: not a folder")
        self.steps = _Table(out / STEPS_FILE, STEP_SCHEMA)
        self.requests = _Table(out / REQUESTS_FILE, REQUEST_SCHEMA)
        self.flush_interval_s = flush_interval_s
        self.on_error = on_error
        self.on_flush = on_flush
        self.flush_s = 0.0  # CPU time spent writing parts (s)
        self._step = 0
        self._lock = threading.Lock()  # the buffers
        self._write_lock = threading.Lock()  # the parts
        self._stop = threading.Event()
        # The first Parquet write costs ~0.3 s of one-time set-up: pay it now, while the engine
        # starts, not in the middle of the load. Both tables exist from here on.
        self.flush(always=True)
        self.flush_s = 0.0
        self._thread = threading.Thread(target=self._flusher, name="engine-tables", daemon=True)
        self._thread.start()

    def step(
        self,
        t: float,
        *,
        kv_cache_usage: float,
        running: int,
        waiting: int,
        preemptions_total: int,
        scheduled_tokens: int,
        kv_blocks_in_use: int | None = None,
        kv_blocks_cached_free: int | None = None,
    ) -> None:
        """One engine step ending at ``t`` (monotonic s); KV usage as a 0..1 fraction, KV
        blocks in use and free-but-cached as counts (``None``: not known)."""
        with self._lock:
            c = self.steps.columns
            c["t"].append(t)
            c["step"].append(self._step)
            c["kv_cache_usage"].append(kv_cache_usage)
            c["num_requests_running"].append(running)
            c["num_requests_waiting"].append(waiting)
            c["num_preemptions_total"].append(preemptions_total)
            c["num_scheduled_tokens"].append(scheduled_tokens)
            c["kv_blocks_in_use"].append(kv_blocks_in_use)
            c["kv_blocks_cached_free"].append(kv_blocks_cached_free)
            self._step += 1

    def request(self, row: dict[str, Any]) -> None:
        """One request's row (keys: the columns of ``REQUEST_SCHEMA``; a missing key is null)."""
        with self._lock:
            self.requests.append(row)

    @property
    def steps_recorded(self) -> int:
        """Step rows recorded so far."""
        return self._step

    def flush(self, *, always: bool = False) -> None:
        """Write the buffered rows of both tables now, then call ``on_flush``."""
        t0 = time.thread_time()  # CPU time: waiting for the GIL is not the flush's cost
        with self._write_lock:
            with self._lock:
                steps, requests = self.steps.take(), self.requests.take()
                through = time.monotonic()
            self.steps.write(steps, always=always)
            self.requests.write(requests, always=always)
            marker = self.steps.path.parent / FLUSHED_FILE
            tmp = marker.with_name(f".{FLUSHED_FILE}")
            tmp.write_text(repr(through))
            tmp.replace(marker)
        self.flush_s += time.thread_time() - t0
        if self.on_flush is not None:
            self.on_flush(self)

    def _flusher(self) -> None:
        """Flush every ``flush_interval_s``, and at once when a reader asks
        (:data:`FLUSH_REQUEST_FILE`)."""
        request = self.steps.path.parent / FLUSH_REQUEST_FILE
        last = time.monotonic()
        while not self._stop.wait(FLUSH_POLL_S):
            asked = request.exists()
            if not asked and time.monotonic() - last < self.flush_interval_s:
                continue
            try:
                if asked:  # before the flush: a request made after it gets the next one
                    request.unlink(missing_ok=True)
                self.flush()
            except Exception as exc:  # noqa: BLE001 - reported, never raised into the engine
                if self.on_error is not None:
                    self.on_error(exc)
                return
            last = time.monotonic()

    @property
    def closed(self) -> bool:
        return self._stop.is_set()

    def close(self) -> None:
        """Stop the flushing thread and write what is buffered (both tables exist afterwards);
        a second call does nothing."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.flush(always=True)

    def close_quietly(self) -> None:
        """Stop the flushing thread without writing (after a failure)."""
        self._stop.set()


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


def read_status(out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``engine_probe.json`` in ``out_dir``; ``{}`` if it is missing or unreadable."""
    try:
        data = json.loads((Path(out_dir) / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
