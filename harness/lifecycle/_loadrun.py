"""Load processes: one headless Locust process per user group.

Each group runs ``locust -f loadgen/locustfile.py --headless`` with its own configuration file,
log and records file in the run folder; Locust's own summary statistics end the log.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import loadgen
from harness.servers import start_process, stop_process_group
from loadgen import SATURATION_ENV, VANISH_TABLE_ENV, UserGroupConfig, group_file
from netem import remove_resource

LOCUSTFILE = Path(loadgen.__file__).with_name("locustfile.py")


@dataclass
class LoadProcess:
    """A running Locust process of one group."""

    group: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    records_path: Path
    log_path: Path

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, *, grace_s: float = 10.0) -> int | None:
        return stop_process_group(self.proc, grace_s=grace_s)

    def processes(self) -> list[tuple[subprocess.Popen[bytes], str]]:
        """The processes of this load, each with what it is (``locust <group>``)."""
        return [(self.proc, f"locust {self.group}")]

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` keeps of this load process."""
        return {"group": self.group, "argv": self.argv}

    def death(self, code: int | None) -> str | None:
        """Why the process failed, given the exit ``code`` it ended with on its own (``None``:
        still running when the run stopped it), or ``None`` if it did not: Locust exits 0 when
        its users are done, failed requests included (``loadgen.exit_zero_on_request_failures``),
        and non-zero only when it crashed or was killed."""
        detail = exit_detail(code)
        return (
            None
            if detail is None
            else (f"load process of group {self.group} {detail} (see {self.log_path.name})")
        )


def exit_detail(code: int | None) -> str | None:
    """A process's exit ``code`` in words (``was killed by SIGKILL``, ``exited with code 2``);
    ``None`` for 0 or a process still running."""
    if code is None or code == 0:
        return None
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def vanish_table(run_dir: Path) -> str:
    """The nftables table (family ``inet``) of the run's vanished clients (``loadgen._vanish``):
    ``zw-vanish-`` and a digest of the run folder."""
    return f"zw-vanish-{hashlib.sha1(str(run_dir).encode()).hexdigest()[:10]}"


def release_vanished(run_dir: Path, netns: list[str | None]) -> None:
    """Delete the run's vanish table in each of ``netns`` (``None``: this namespace), if it is
    there: the servers may now hear the vanished clients close. Never raises."""
    for ns in netns:
        try:
            remove_resource("nft-table", f"inet {vanish_table(run_dir)}", ns)
        except Exception:  # noqa: BLE001 - best effort; `netem clean` removes a leftover
            pass


def start_load(
    group: UserGroupConfig,
    *,
    run_dir: Path,
    host: str,
    model: str,
    seed: int,
    max_duration_s: float,
    plugins: list[str] | None = None,
    netns: str | None = None,
) -> LoadProcess:
    """Write the group's configuration and start its Locust process (inside network namespace
    ``netns``, if given; importing the scenario's ``plugins`` first). Raises ``OSError`` if
    Locust cannot be started."""
    config_path = run_dir / f"group-{group.name}.json"
    rec_path = group_file(run_dir, "records", group.name, None)
    config_path.write_text(
        json.dumps(
            {
                "group": group.model_dump(mode="json"),
                "host": host,
                "model": model,
                "records_path": str(rec_path),
                "seed": seed,
                "plugins": plugins or [],
            },
            indent=2,
        )
    )
    argv = [
        sys.executable, "-m", "locust",
        "-f", str(LOCUSTFILE),
        "--headless",
        "--host", host,
        "-u", str(group.locust_users()),
        "-r", str(group.locust_users()),
        "--run-time", f"{max(1, int(max_duration_s))}s",
        "--stop-timeout", "5",
        "--only-summary",
        "--zw-group-config", str(config_path),
    ]  # fmt: skip
    log_path = run_dir / f"locust-{group.name}.log"
    proc = start_process(
        argv,
        log_path=log_path,
        env={
            SATURATION_ENV: str(group_file(run_dir, "saturation", group.name, None)),
            VANISH_TABLE_ENV: vanish_table(run_dir),
        },
        netns=netns,
    )
    return LoadProcess(group.name, argv, proc, rec_path, log_path)
