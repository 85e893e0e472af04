"""A run folder whose harness was killed (SIGKILL, the OOM killer, a CI time limit): its
``run.json`` still says ``running`` and has no end. Its records, engine tables and logs are on
disk; :func:`killed_run_end` gives what the end of the run would have written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.runfolder import RUN_JSON, run_records
from netem import process_alive
from zwcore import RunFolderError


def killed_run_end(run_dir: Path, info: dict[str, Any], groups: list[str]) -> tuple[float, str]:
    """``(duration_s, failure)`` of the run in ``run_dir`` whose ``run.json`` (``info``) says
    ``running``: the duration runs from its start (``clock.monotonic_at_start_s``) to the last
    moment its records of ``groups`` know (a request's end, last byte or send; 0 without
    records), and the failure says the run was killed and where its data stops. Raises
    :class:`~zwcore.RunFolderError` while the run's harness process (``run.json``'s
    ``harness``: pid and start time in clock ticks, proc(5)) still runs."""
    owner = info.get("harness") or {}
    pid = owner.get("pid")
    if pid is not None and process_alive(int(pid), owner.get("start_ticks")):
        raise RunFolderError(
            f"{run_dir / RUN_JSON}: the run is still running (pid {pid}); analyse it once it ended"
        )
    start = (info.get("clock") or {}).get("monotonic_at_start_s")
    records = run_records(run_dir, groups)
    times = [t for r in records for t in (r.t_end, r.t_last_byte, r.t_send) if t is not None]
    duration = max(0.0, max(times) - float(start)) if times and start is not None else 0.0
    failure = (
        f"killed: the run's harness ended without its clean-up; its records stop "
        f"{duration:.1f} s after the start ({len(records)} requests recorded)"
    )
    return duration, failure
