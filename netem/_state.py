"""The state file: every network resource a run creates, written down before it is created.

A run's ``netem-state.json`` (in its run folder, with a copy under ``/run/zerowindow/``, so
``zerowindow netem clean`` finds it without knowing the results folder) holds::

    {"run_id": "a1b2c3", "owner": {"pid": 123, "start_ticks": 456},
     "status": "active" | "released" | "cleaned",
     "resources": [{"kind": "netns", "name": "zw-a1b2c3-srv"},
                   {"kind": "link", "name": "zw-a1b2c3-h", "netns": null},
                   {"kind": "qdisc", "netns": "...", "ifname": "...", ...},
                   {"kind": "nft_table", "netns": null, "family": "inet", "name": "zw-..."},
                   {"kind": "process", "pid": 789, "start_ticks": 1011, "what": "..."}]}

A resource is recorded before the call that creates it, so a crash between the two leaves a
record of something that may not exist; clean-up treats a missing resource as removed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from netem._netns import process_alive, process_start_ticks

STATE_NAME = "netem-state.json"
RUNTIME_DIR = Path("/run/zerowindow")


class NetemState:
    """The state file of run ``run_id`` at ``run_dir / STATE_NAME`` (and its runtime copy)."""

    def __init__(self, run_dir: Path, run_id: str, *, runtime_dir: Path = RUNTIME_DIR) -> None:
        self.path = run_dir / STATE_NAME
        self.runtime_path = runtime_dir / f"{run_id}.json"
        pid = os.getpid()
        self.data: dict[str, Any] = {
            "run_id": run_id,
            "run_dir": str(run_dir.resolve()),
            "owner": {"pid": pid, "start_ticks": process_start_ticks(pid)},
            "status": "active",
            "resources": [],
        }
        self._write()

    @property
    def resources(self) -> list[dict[str, Any]]:
        return list(self.data["resources"])

    def record(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Append a resource (``kind`` plus JSON-able ``fields``) and write the file before
        returning: call it before creating the resource."""
        entry = {"kind": kind, **fields}
        self.data["resources"].append(entry)
        self._write()
        return entry

    def finish(self, status: str = "released") -> None:
        """Mark everything released; the runtime copy is removed."""
        self.data["status"] = status
        _atomic_write(self.path, self.data)
        self.runtime_path.unlink(missing_ok=True)

    def _write(self) -> None:
        _atomic_write(self.path, self.data)
        try:
            self.runtime_path.parent.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.runtime_path, self.data)
        except OSError:
            pass  # the run folder's copy is the record; the runtime copy only helps `clean`


def _atomic_write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any] | None:
    """The state in ``path``, or ``None`` if it is not a readable state file."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and "run_id" in data else None


def owner_alive(state: dict[str, Any]) -> bool:
    """Whether the process that wrote ``state`` still runs (pid and start time match)."""
    owner = state.get("owner") or {}
    pid = owner.get("pid")
    return isinstance(pid, int) and process_alive(pid, owner.get("start_ticks"))
