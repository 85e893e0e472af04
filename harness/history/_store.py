"""The history store: every run and plan aggregate of every scenario, in one DuckDB file.

Tables (DuckDB, https://duckdb.org/docs/sql/introduction):

- ``zw_meta`` (``key``, ``value``): ``app = zerowindow`` and ``schema_version``; a database
  without it is not the toolkit's and is never written to;
- ``zw_entries``: one row an entry (:class:`~harness.history._entries.Entry`: a run, or one
  configuration of a plan over its repeats), with its provenance and series as JSON;
- ``zw_figures`` (``entry_id``, ``figure``, ``value``, ``low``, ``high``): its figures, with
  the interval where it was measured over repeats;
- ``zw_gates`` (``entry_id``, ``gate``, ``figure``, ``verdict``, ``passed``, ``measured``,
  ``bound``, ``reason``): its gate outcomes.

Adding is idempotent: an entry whose ``entry_id`` is already there is left as it is.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pandas as pd

from harness.history._entries import Entry
from zwcore import HistoryError

SCHEMA_VERSION = "1"
APP = "zerowindow"
LOCK_WAIT_S = 10.0  # how long to wait for another process's lock on the file

_SCHEMA = [
    "CREATE TABLE zw_meta (key VARCHAR PRIMARY KEY, value VARCHAR)",
    """CREATE TABLE zw_entries (
        entry_id VARCHAR PRIMARY KEY, kind VARCHAR, scenario VARCHAR, arm VARCHAR,
        series VARCHAR, series_key JSON, scenario_hash VARCHAR, started_utc TIMESTAMPTZ,
        added_utc TIMESTAMPTZ, status VARCHAR, exit_code INTEGER, repeats INTEGER,
        folder VARCHAR, commit_sha VARCHAR, ci_run_id VARCHAR, provenance JSON,
        verdicts JSON)""",
    """CREATE TABLE zw_figures (
        entry_id VARCHAR, figure VARCHAR, value DOUBLE, low DOUBLE, high DOUBLE,
        PRIMARY KEY (entry_id, figure))""",
    """CREATE TABLE zw_gates (
        entry_id VARCHAR, gate VARCHAR, figure VARCHAR, verdict VARCHAR, passed BOOLEAN,
        measured DOUBLE, bound DOUBLE, reason VARCHAR)""",
]
_TABLES = {"zw_meta", "zw_entries", "zw_figures", "zw_gates"}


class HistoryStore:
    """One history file, open. Use as a context manager (or call :meth:`close`).

    ``path``: the DuckDB file; it is created (with its folder) when missing unless
    ``read_only``. Raises :class:`~zwcore.HistoryError` for a file that is no DuckDB database,
    a database the toolkit did not create (its tables are named), a newer schema, or a file
    another process holds locked for longer than ``LOCK_WAIT_S``; the file is never changed
    then."""

    def __init__(self, path: Path, *, read_only: bool = False) -> None:
        import duckdb

        self.path = Path(path)
        if read_only and not self.path.is_file():
            raise HistoryError(f"{self.path}: no history here (no file)")
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                self._con = duckdb.connect(str(self.path), read_only=read_only)
                break
            except duckdb.Error as exc:
                locked = "lock" in str(exc).lower()
                if locked and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                text = str(exc)
                if locked:
                    why = f"held by another process for over {LOCK_WAIT_S:g} s: {text}"
                elif "Read-only file system" in text or "Permission denied" in text:
                    why = f"cannot be written here: {text}"
                else:
                    why = f"not a history file (DuckDB cannot read it: {text}); left as it is"
                raise HistoryError(f"{self.path}: {why}") from None
        try:
            self._check_schema(read_only)
        except BaseException:
            self._con.close()
            raise

    def _check_schema(self, read_only: bool) -> None:
        tables = {
            r[0] for r in self._con.execute("SELECT table_name FROM duckdb_tables()").fetchall()
        }
        if not tables and read_only:
            raise HistoryError(f"{self.path}: an empty database: no run was added to it yet")
        if not tables:
            with self._transaction():
                for statement in _SCHEMA:
                    self._con.execute(statement)
                self._con.executemany(
                    "INSERT INTO zw_meta VALUES (?, ?)",
                    [("app", APP), ("schema_version", SCHEMA_VERSION)],
                )
            return
        meta = dict(self._con.execute("SELECT key, value FROM zw_meta").fetchall()) if (
            "zw_meta" in tables) else {}  # fmt: skip
        if meta.get("app") != APP or not _TABLES <= tables:
            raise HistoryError(
                f"{self.path}: a DuckDB database that is not a zerowindow history (tables: "
                f"{', '.join(sorted(tables)) or 'none'}); left as it is"
            )
        if meta.get("schema_version") != SCHEMA_VERSION:
            raise HistoryError(
                f"{self.path}: history schema {meta.get('schema_version')}, this toolkit reads "
                f"{SCHEMA_VERSION}: use the toolkit version that wrote it"
            )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._con.execute("BEGIN TRANSACTION")
        try:
            yield
        except BaseException:
            self._con.execute("ROLLBACK")
            raise
        self._con.execute("COMMIT")

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._con.close()

    # -- writing ------------------------------------------------------------------------

    def add(self, entries: Iterable[Entry]) -> list[Entry]:
        """Add ``entries`` in one transaction; returns those that were new (an entry already
        in the store is left as it is: adding the same run twice changes nothing)."""
        entries = list(entries)
        ids = [e.entry_id for e in entries]
        known = {r[0] for r in self._con.execute(
            "SELECT entry_id FROM zw_entries WHERE list_contains(?, entry_id)", [ids]
        ).fetchall()}  # fmt: skip
        new = [e for e in entries if e.entry_id not in known]
        new = list({e.entry_id: e for e in new}.values())
        if not new:
            return []
        entries_df = pd.DataFrame([e.row() for e in new])
        figures_df = pd.DataFrame(
            [(e.entry_id, f, *v) for e in new for f, v in e.figures.items()],
            columns=["entry_id", "figure", "value", "low", "high"],
        )
        gates_df = pd.DataFrame(
            [(e.entry_id, *g) for e in new for g in e.gates],
            columns=["entry_id", "gate", "figure", "verdict", "passed", "measured", "bound",
                     "reason"],
        )  # fmt: skip
        with self._transaction():
            for table, frame in (("zw_entries", entries_df), ("zw_figures", figures_df),
                                 ("zw_gates", gates_df)):  # fmt: skip
                if len(frame):
                    self._con.register("_frame", frame)
                    self._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _frame")
                    self._con.unregister("_frame")
        return new

    # -- reading ------------------------------------------------------------------------

    def scenarios(self) -> list[str]:
        """The scenario names the store holds, sorted."""
        rows = self._con.execute("SELECT DISTINCT scenario FROM zw_entries ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def entries(self, scenario: str, *, since: str | None = None) -> pd.DataFrame:
        """The entries of ``scenario`` (oldest first; ``since``: an ISO date or time, those
        that started then or later): one row each, the columns of ``zw_entries`` with
        ``series_key``, ``provenance`` and ``verdicts`` as dicts."""
        query = "SELECT * FROM zw_entries WHERE scenario = ?"
        params: list[Any] = [scenario]
        if since:
            query += " AND started_utc >= CAST(? AS TIMESTAMPTZ)"
            params.append(since)
        frame = self._con.execute(query + " ORDER BY started_utc, entry_id", params).df()
        for column in ("series_key", "provenance", "verdicts"):
            frame[column] = [json.loads(v) if v else {} for v in frame[column]]
        return frame

    def figures(self, entry_ids: Sequence[str]) -> pd.DataFrame:
        """The figures of the entries ``entry_ids``: ``entry_id``, ``figure``, ``value``,
        ``low``, ``high``."""
        return self._con.execute(
            "SELECT * FROM zw_figures WHERE list_contains(?, entry_id) ORDER BY entry_id, figure",
            [list(entry_ids)],
        ).df()

    def gates(self, entry_ids: Sequence[str]) -> pd.DataFrame:
        """The gate outcomes of the entries ``entry_ids`` (columns of ``zw_gates``)."""
        return self._con.execute(
            "SELECT * FROM zw_gates WHERE list_contains(?, entry_id)", [list(entry_ids)]
        ).df()

    def series_values(
        self, series: str, figure: str, *, exclude: str | None = None
    ) -> list[tuple[str, float]]:
        """``(entry_id, value)`` of ``figure`` in every complete entry of ``series`` (oldest
        first by start time; a run that failed or was interrupted measured part of its
        workload) that measured it, but ``exclude``."""
        rows = self._con.execute(
            """SELECT e.entry_id, f.value FROM zw_entries e JOIN zw_figures f USING (entry_id)
               WHERE e.series = ? AND f.figure = ? AND f.value IS NOT NULL
                 AND e.status = 'complete'
                 AND e.entry_id IS DISTINCT FROM ?
               ORDER BY e.started_utc, e.entry_id""",
            [series, figure, exclude],
        ).fetchall()
        return [(r[0], float(r[1])) for r in rows]
