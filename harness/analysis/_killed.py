"""A run folder whose harness was killed (SIGKILL, the OOM killer, a CI time limit): its
``run.json`` still says ``running`` and has no end. Its records, engine tables and logs are on
disk; :func:`killed_run_end` gives what the end of the run would have written, and
:func:`killed_plan_end` what the end of a plan of several runs would have."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.runfolder import PLAN_JSON, RUN_JSON, run_records
from netem import process_alive
from zwcore import RunFolderError


def killed_run_end(run_dir: Path, info: dict[str, Any], groups: list[str]) -> tuple[float, str]:
    """``(duration_s, failure)`` of the run in ``run_dir`` whose ``run.json`` (``info``) says
    ``running``: the duration runs from its start (``clock.monotonic_at_start_s``) to the last
    moment its records of ``groups`` know (a request's end, last byte or send; 0 without
    records), and the failure says the run was killed and where its data stops. Raises
    :class:`~zwcore.RunFolderError` while the run's harness process (``run.json``'s
    ``harness``: pid and start time in clock ticks, proc(5)) still runs."""
    _refuse_while_running(run_dir / RUN_JSON, info)
    start = (info.get("clock") or {}).get("monotonic_at_start_s")
    records = run_records(run_dir, groups)
    times = [t for r in records for t in (r.t_end, r.t_last_byte, r.t_send) if t is not None]
    duration = max(0.0, max(times) - float(start)) if times and start is not None else 0.0
    failure = (
        f"its harness was killed before its clean-up; its records stop "
        f"{duration:.1f} s after the start ({len(records)} requests recorded)"
    )
    return duration, failure


def killed_plan_end(folder: Path, info: dict[str, Any], recorded: list[str]) -> tuple[str, str]:
    """``(status, failure)`` of the plan in ``folder`` whose ``plan.json`` (``info``) says
    ``running``: ``killed`` when some of its runs ended (``recorded``: their paths), ``failed``
    when none did (nothing was measured); the failure names the run folders it left
    unfinished (each analyses on its own, as killed). Raises :class:`~zwcore.RunFolderError`
    while the plan's harness process still runs."""
    _refuse_while_running(folder / PLAN_JSON, info)
    unfinished = sorted(
        str(p.parent.relative_to(folder))
        for p in folder.rglob(RUN_JSON)
        if str(p.parent.relative_to(folder)) not in recorded
    )
    left = f"; unfinished: {', '.join(unfinished)} (analyse each on its own)" if unfinished else ""
    failure = f"its harness was killed before its clean-up, after {len(recorded)} run(s){left}"
    return ("killed" if recorded else "failed"), failure


def _refuse_while_running(path: Path, info: dict[str, Any]) -> None:
    """Raise :class:`~zwcore.RunFolderError` while the process that writes ``path`` (its
    ``harness``: pid and start time in clock ticks, proc(5)) still runs."""
    owner = info.get("harness") or {}
    pid = owner.get("pid")
    if pid is not None and process_alive(int(pid), owner.get("start_ticks")):
        raise RunFolderError(f"{path}: still running (pid {pid}); analyse it once it ended")
