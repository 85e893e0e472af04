"""Baselines: the figures of a reference run, kept for relative gates (``<= 1.2 * baseline``).

``zerowindow baseline save RUN_DIR`` writes ``results/baselines/<scenario>.json``::

    {"format": 1, "scenario": "sim-coupled",
     "figures": {"fast.ttft_p99_ms": 812.5, ...},            # harness.runfolder._figures names
     "provenance": {"run_dir": ..., "saved_utc": ..., "run_started_utc": ..., "status": ...,
                    "versions": {...}, "host": {...}, "scenario_path": ...}}

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

from harness.runfolder import RunSummary, figures
from zwcore import RunFolderError

# Where baselines live, relative to the directory `zerowindow` runs from (committed to git).
BASELINE_DIR = Path("results") / "baselines"


class BaselineError(RunFolderError):
    """A baseline that cannot be saved or loaded; ``str(error)`` names the file and the fix."""


class Baseline(BaseModel):
    """The content of a baseline file. ``figures`` maps figure names to values (``None``: the
    reference run did not measure it)."""

    format: Literal[1] = 1
    scenario: str
    figures: dict[str, float | None]
    provenance: dict[str, Any] = {}


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
    """Write the figures of the run in ``run_dir`` as a baseline and return the file's path.

    ``dest`` defaults to :func:`baseline_path` of the run's scenario; its folder is created and
    an existing file is replaced atomically. Raises :class:`BaselineError` if the run folder
    has no valid ``summary.json``, if the run did not complete (unless ``allow_incomplete``), or
    if the file cannot be written.
    """
    summary = read_summary(run_dir)
    if summary.status != "complete" and not allow_incomplete:
        raise BaselineError(
            f"{run_dir}: the run is {summary.status!r} ({summary.failure}); a baseline should "
            "come from a complete run (--allow-incomplete to save it anyway)"
        )
    try:
        info = json.loads((run_dir / "run.json").read_text())
    except (OSError, ValueError):
        info = {}
    provenance = {
        "run_dir": str(run_dir.resolve()),
        "saved_utc": datetime.now(UTC).isoformat(),
        "run_started_utc": info.get("started_utc"),
        "status": summary.status,
        "scenario_path": info.get("scenario_path"),
        "versions": info.get("versions"),
        "host": info.get("host"),
    }
    baseline = Baseline(scenario=summary.scenario, figures=figures(summary), provenance=provenance)
    dest = dest or baseline_path(summary.scenario)
    tmp = dest.with_name(f".{dest.name}.tmp")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(baseline.model_dump_json(indent=2) + "\n")
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
