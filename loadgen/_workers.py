"""Where a load process writes its files, alone or as one of several Locust workers.

Importing this module does not import Locust. File names in a run folder (``<group>`` is a
user group name, which never contains ``@``)::

    records-<group>.jsonl             the group's only load process (no workers)
    records-<group>@<worker>.jsonl    worker <worker> of the group's Locust master
    saturation-<group>[@<worker>].jsonl   the same process's CPU and loop-lag samples
    workers-<group>.jsonl             the master's log of its workers (joined, missing, ...)

A process is a worker when the environment variable ``ZW_WORKER_NAME`` names it; it then
writes into the folder ``ZW_WORKER_DIR`` (the run folder for workers the harness starts on
this machine; a local folder for ``zerowindow worker`` on another machine, which also
forwards every line to the master when ``ZW_WORKER_FORWARD`` is ``1``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ._config import GroupRunConfig

WORKER_NAME_ENV = "ZW_WORKER_NAME"
WORKER_DIR_ENV = "ZW_WORKER_DIR"
WORKER_FORWARD_ENV = "ZW_WORKER_FORWARD"
FILE_KINDS = ("records", "saturation")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def valid_worker_name(name: str) -> bool:
    """A worker name is 1 to 64 letters, digits, ``_``, ``.``, ``-`` (it names files)."""
    return bool(_NAME.match(name))


def group_file(run_dir: str | os.PathLike[str], kind: str, group: str, worker: str | None) -> Path:
    """``run_dir/<kind>-<group>.jsonl`` or, for a worker, ``<kind>-<group>@<worker>.jsonl``.

    ``kind`` is ``records`` or ``saturation``. Raises ``ValueError`` for another kind or an
    invalid worker name.
    """
    if kind not in FILE_KINDS:
        raise ValueError(f"file kind must be one of {', '.join(FILE_KINDS)}, got {kind!r}")
    if worker is not None and not valid_worker_name(worker):
        raise ValueError(f"invalid worker name {worker!r}: use letters, digits, '_', '.', '-'")
    suffix = f"@{worker}" if worker is not None else ""
    return Path(run_dir) / f"{kind}-{group}{suffix}.jsonl"


def group_files(run_dir: str | os.PathLike[str], kind: str, group: str) -> list[Path]:
    """Every existing ``kind`` file of ``group`` in ``run_dir``: the single process's, then the
    workers' sorted by name."""
    single = group_file(run_dir, kind, group, None)
    workers = sorted(Path(run_dir).glob(f"{kind}-{group}@*.jsonl"))
    return ([single] if single.exists() else []) + workers


def group_of(path: Path) -> str:
    """The group name in a file name made by :func:`group_file` (``<kind>-<group>[@<worker>]``;
    a file kind never contains ``-``)."""
    stem = path.name.removesuffix(".jsonl")
    return stem.partition("-")[2].partition("@")[0]


def worker_of(path: Path) -> str | None:
    """The worker name in a file name made by :func:`group_file`, or ``None``."""
    stem = path.name.removesuffix(".jsonl")
    return stem.rpartition("@")[2] if "@" in stem else None


def workers_log(run_dir: str | os.PathLike[str], group: str) -> Path:
    """The master's log of its workers: ``run_dir/workers-<group>.jsonl``."""
    return Path(run_dir) / f"workers-{group}.jsonl"


@dataclass(frozen=True)
class WorkerIdentity:
    """This process as a Locust worker: its ``name``, the folder it writes to, and whether it
    forwards its lines to the master."""

    name: str
    out_dir: Path
    forward: bool


def this_worker() -> WorkerIdentity | None:
    """The worker identity from the environment, or ``None`` when this process is not a
    worker. Raises ``ValueError`` for an invalid ``ZW_WORKER_NAME``."""
    name = os.environ.get(WORKER_NAME_ENV)
    if not name:
        return None
    if not valid_worker_name(name):
        raise ValueError(
            f"{WORKER_NAME_ENV}={name!r} is not a valid worker name: "
            "1 to 64 letters, digits, '_', '.', '-'"
        )
    out = Path(os.environ.get(WORKER_DIR_ENV) or ".")
    return WorkerIdentity(name, out, os.environ.get(WORKER_FORWARD_ENV) == "1")


def locustfile_source(run: GroupRunConfig) -> str:
    """The text of a locustfile that runs ``run`` without any other file: what the harness
    gives a Locust master, and what workers started with ``-f -`` receive from it."""
    return (
        f'"""zerowindow load of user group {run.group.name!r} (generated; Locust workers '
        'started with `-f -` receive this file from the master)."""\n\n'
        "from loadgen.locustfile import install_group_json\n\n"
        f"install_group_json(globals(), {run.model_dump_json()!r})\n"
    )
