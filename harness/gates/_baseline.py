"""Baselines: the figures of a reference run, kept for relative gates (``<= 1.2 * baseline``).

``zerowindow baseline save RUN_DIR`` writes ``results/baselines/<scenario>.json``::

    {"format": 2, "scenario": "sim-coupled",
     "figures": {"fast.ttft_p99_ms": 812.5, ...},            # harness.runfolder._figures names
     "repeats": [{"fast.ttft_p99_ms": 790.1, ...}, ...],     # each repeat's figures
     "samples_file": "sim-coupled.samples.parquet",          # beside it: per-request samples
     "provenance": {"run_dir": ..., "saved_utc": ..., "run_started_utc": ..., "status": ...,
                    "repeats": 3, "versions": {...}, "host": {...}, "scenario_path": ...}}

``RUN_DIR`` is one run folder, or the folder of a run with repeats (``repeats.json``: every
repeat is kept). ``figures`` are the estimates over the repeats (pooled requests for latency
figures, mean of the repeats for others: ``harness.analysis._uncertainty``); the samples file
holds the pooled per-request latencies (columns ``repeat``, ``request``, ``sample``,
``value``), which intervals and distribution gates need. A format-1 file (figures only) still
loads: its one run has no samples, and its gates compare figures as they are.

``zerowindow run`` loads it (or ``--baseline PATH``) before the run starts when any gate refers
to ``baseline``; a missing or unreadable file is :class:`BaselineError` (exit 2), never a pass.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from harness.analysis import Evidence, evidence_of, pooled_figures, run_folders
from harness.runfolder import PLAN_JSON, RUN_JSON, RunSummary, read_parquet
from zwcore import RunFolderError

# Where baselines live, relative to the directory `zerowindow` runs from (committed to git).
BASELINE_DIR = Path("results") / "baselines"


class BaselineError(RunFolderError):
    """A baseline that cannot be saved or loaded; ``str(error)`` names the file and the fix."""


class Baseline(BaseModel):
    """The content of a baseline file. ``figures`` maps figure names to values (``None``: the
    reference run did not measure it)."""

    format: Literal[1, 2] = 2
    scenario: str
    figures: dict[str, float | None]
    repeats: list[dict[str, float | None]] = []
    samples_file: str | None = None
    provenance: dict[str, Any] = {}

    def evidence(self, path: Path) -> Evidence:
        """The baseline as :class:`~harness.analysis.Evidence` (``path``: this file, beside
        which the samples file lies). Raises :class:`BaselineError` if the samples file is
        named but cannot be read."""
        samples = None
        if self.samples_file is not None:
            where = path.parent / self.samples_file
            try:
                samples = read_parquet(where)
            except RunFolderError as exc:
                raise BaselineError(str(exc)) from None
            if not len(samples.columns):
                raise BaselineError(f"{where}: the baseline's samples file is missing")
        repeats = self.repeats or [self.figures]
        return Evidence(repeats) if samples is None else Evidence(repeats, samples)


def baseline_path(scenario: str, root: Path = BASELINE_DIR) -> Path:
    """The default baseline file of scenario ``scenario``: ``root/<scenario>.json``."""
    return root / f"{scenario}.json"


def read_summary(run_dir: Path) -> RunSummary:
    """The :class:`RunSummary` of a run folder. Raises :class:`BaselineError` if
    ``summary.json`` is missing or invalid."""
    path = run_dir / "summary.json"
    try:
        return RunSummary.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise BaselineError(f"{path}: cannot read the run's summary: {exc.strerror}") from None
    except ValidationError as exc:
        raise BaselineError(
            f"{path}: not a zerowindow summary ({exc.error_count()} errors: "
            f"{exc.errors()[0]['msg']})"
        ) from None


def save_baseline(
    run_dir: Path, dest: Path | None = None, *, allow_incomplete: bool = False
) -> Path:
    """Write the figures of the run in ``run_dir`` (one run folder, or a run with repeats) as
    a baseline, with its samples beside it, and return the file's path.

    ``dest`` defaults to :func:`baseline_path` of the run's scenario; its folder is created and
    existing files are replaced atomically. Raises :class:`BaselineError` if a run folder has
    no valid ``summary.json``, if a run did not complete (unless ``allow_incomplete``), or if
    the files cannot be written.
    """
    try:
        dirs = run_folders(run_dir)
    except RunFolderError as exc:
        raise BaselineError(str(exc)) from None
    for one in dirs:
        summary = read_summary(one)
        if summary.status != "complete" and not allow_incomplete:
            raise BaselineError(
                f"{one}: the run is {summary.status!r} ({summary.failure}); a baseline should "
                "come from a complete run (--allow-incomplete to save it anyway)"
            )
    try:
        evidence = evidence_of(dirs)
    except RunFolderError as exc:
        raise BaselineError(str(exc)) from None
    run_dir = dirs[0] if len(dirs) == 1 else run_dir
    # Where the run (or the plan its repeats belong to) recorded where and when it ran.
    places = [run_dir / RUN_JSON] if len(dirs) == 1 else [run_dir / PLAN_JSON, dirs[0] / RUN_JSON]
    info: dict[str, Any] = {}
    for record in places:
        try:
            info = json.loads(record.read_text())
            break
        except (OSError, ValueError):
            continue
    plan = info.get("plan") or {}
    provenance = {
        "run_dir": str(run_dir.resolve()),
        "saved_utc": datetime.now(UTC).isoformat(),
        "run_started_utc": info.get("started_utc"),
        "status": summary.status,
        "scenario_path": info.get("scenario_path", plan.get("scenario_path")),
        "versions": info.get("versions"),
        "host": info.get("host"),
        "repeats": len(dirs),
    }
    dest = dest or baseline_path(summary.scenario)
    samples_file = f"{dest.stem}.samples.parquet"
    baseline = Baseline(
        scenario=summary.scenario,
        figures=pooled_figures(evidence),
        repeats=[dict(f) for f in evidence.figures],
        samples_file=samples_file,
        provenance=provenance,
    )
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp_samples = dest.with_name(f".{samples_file}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        evidence.samples.to_parquet(tmp_samples, index=False)
        tmp.write_text(baseline.model_dump_json(indent=2) + "\n")
        os.replace(tmp_samples, dest.parent / samples_file)
        os.replace(tmp, dest)
    except OSError as exc:
        raise BaselineError(f"{dest}: cannot write the baseline: {exc.strerror}") from None
    return dest


def load_baseline(path: Path) -> Baseline:
    """Read a baseline file. Raises :class:`BaselineError` naming the file if it is missing
    (with the command that creates it), unreadable, or not a baseline."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BaselineError(
            f"no baseline at {path}: a gate refers to 'baseline'. Save one from a reference run "
            "with `zerowindow baseline save RUN_DIR`, or pass --baseline PATH"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BaselineError(f"{path}: cannot read the baseline: {exc}") from None
    try:
        return Baseline.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise BaselineError(f"{path}: not a zerowindow baseline: {where}: {first['msg']}") from None
