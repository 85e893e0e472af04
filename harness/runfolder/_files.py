"""The run folder's file names, each defined once, and where a run folder is made.

``docs/run-folder.md`` says what each file holds. Per-group files of the load processes
(``records-<group>[@<worker>].jsonl``, ``saturation-...``) are named by ``loadgen``, which
writes them.
"""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

from harness._engine_probe import REQUESTS_FILE, STATUS_FILE, STEPS_FILE
from loadgen import (
    RequestRecord,
    clock_estimates,
    group_files,
    group_of,
    read_records,
    to_harness_clock,
    worker_of,
)
from zwcore import is_file_plugin

RUN_JSON = "run.json"
SUMMARY_JSON = "summary.json"
GATES_JSON = "gates.json"
BASELINE_JSON = "baseline.json"  # a copy of the baseline the run was gated against
JUNIT_XML = "junit.xml"
REPORT_HTML = "report.html"
SCENARIO_TOML = "scenario.toml"
ERROR_LOG = "error.log"
REQUESTS = "requests.parquet"
CHUNKS = "chunks.parquet"
TRACES_OTLP = "traces.otlp.json"  # the requests' spans, OTLP/JSON (harness.analysis._otlp)
SERVER_METRICS = "server_metrics.parquet"
SOCKETS = "sockets.parquet"
PROXY = "proxy.parquet"
WIRE = "wire.parquet"
ACCELERATOR = "accelerator.parquet"  # the GPUs' NVML samples, where the machine has GPUs
ENGINE_STEPS = STEPS_FILE  # written by the engine (probe or emulator)
ENGINE_REQUESTS = REQUESTS_FILE
ENGINE_PROBE_JSON = STATUS_FILE
COMPARISON_MD = "comparison.md"
COMPARISON_JSON = "comparison.json"
PLAN_JSON = "plan.json"  # a plan of several runs: the plan, the runs it made, its record
SWEEP_JSON = "sweep.json"
SUITE_JSON = "suite.json"  # a suite: its incidents, each a plan, and their cases
REPEATS_JSON = "repeats.json"  # a run with repeats: its repeats, figures with intervals, gates


def records_files(run_dir: Path, group: str) -> list[Path]:
    """The records files of ``group`` (one per process that wrote any), sorted."""
    return group_files(run_dir, "records", group)


def run_records(run_dir: Path, groups: list[str] | None = None) -> list[RequestRecord]:
    """Every record of ``groups`` (default: every group with a records file) in ``run_dir``,
    on the harness's clock: a worker whose clock its master measured (one on another machine,
    ``loadgen._clock``) has its records moved by its offset. Raises ``OSError`` for a file that
    cannot be read, ``ValueError`` for a malformed line."""
    if groups is None:
        groups = sorted({group_of(p) for p in run_dir.glob("records-*.jsonl")})
    records: list[RequestRecord] = []
    for group in groups:
        clocks = clock_estimates(run_dir, group)
        for path in records_files(run_dir, group):
            clock = clocks.get(worker_of(path) or "")
            read = read_records(path)
            records.extend(read if clock is None else (to_harness_clock(r, clock) for r in read))
    return records


def saturation_files(run_dir: Path, group: str) -> list[Path]:
    """The saturation files of ``group``; a group that was never sampled still names its
    single-process file, so that the summary says it is missing."""
    return group_files(run_dir, "saturation", group) or [run_dir / f"saturation-{group}.jsonl"]


def new_run_dir(out_root: Path, scenario: str) -> Path:
    """``out_root/<scenario>/<UTC timestamp>/``, created; a suffix keeps it unique. Raises
    ``OSError`` if it cannot be created."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = out_root / scenario / stamp
    run_dir, n = base, 1
    while run_dir.exists():
        n += 1
        run_dir = base.with_name(f"{stamp}-{n}")
    run_dir.mkdir(parents=True)
    return run_dir


PLUGINS_DIR = "plugins"  # copies of the scenario's .py plugins


def keep_plugins(run_dir: Path, specs: list[str]) -> None:
    """Copy the scenario's file plugins (absolute ``.py`` paths among ``specs``; module names
    are left out) into ``run_dir/plugins/`` as ``<index>-<file name>``, so that the run folder
    can be analysed where the files are not. Raises ``OSError`` if a copy cannot be made."""
    for i, spec in enumerate(specs):
        if is_file_plugin(spec) and Path(spec).is_file():
            (run_dir / PLUGINS_DIR).mkdir(exist_ok=True)
            shutil.copyfile(spec, run_dir / PLUGINS_DIR / f"{i}-{Path(spec).name}")


def kept_plugins(run_dir: Path, specs: list[str]) -> list[str]:
    """``specs`` with each file plugin that is no longer where the run found it replaced by its
    copy in ``run_dir/plugins/`` (see :func:`keep_plugins`), when there is one."""
    out = []
    for i, spec in enumerate(specs):
        copy = run_dir / PLUGINS_DIR / f"{i}-{Path(spec).name}"
        gone = is_file_plugin(spec) and not Path(spec).is_file()
        out.append(str(copy) if gone and copy.is_file() else spec)
    return out
