"""Distributed load: each user group as a Locust master with worker processes.

``zerowindow run --workers N`` starts, for every user group, ``locust --master --headless
--expect-workers N`` on a per-group locustfile that embeds the group's configuration
(``loadgen.locustfile.locustfile_source``) and N ``locust --worker`` processes on this machine;
``--remote-workers M`` makes the master also wait for M workers from elsewhere, which join
with ``zerowindow worker --master HOST:PORT`` (:func:`run_worker`: ``locust -f - --worker``,
Locust's own way of giving workers the master's locustfile). Locust's engine does the rest:
handing out the group's users, collecting statistics, quitting the workers
(https://docs.locust.io/en/stable/running-distributed.html).

Every worker appends its records and saturation samples to its own files
(``records-<group>@<worker>.jsonl``; remote workers send their lines to the master, which
writes the same files into the run folder); the run merges them at the end, and
:func:`worker_reports` says which worker died and how many requests it had recorded. The
harness imports no Locust code (Locust monkey-patches the standard library).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from harness.lifecycle._loadrun import LoadProcess, exit_detail
from harness.runfolder import LoadWorker, WorkerClock
from harness.servers import start_process, stop_process_group
from loadgen import (
    WORKER_DIR_ENV,
    WORKER_FORWARD_ENV,
    WORKER_NAME_ENV,
    GroupRunConfig,
    PlannedArrivals,
    TraceArrivals,
    UserGroupConfig,
    clock_estimates,
    group_file,
    locustfile_source,
    valid_worker_name,
    workers_log,
)
from zwcore import LoadError

# How long a master waits for its workers to connect before giving up (s).
EXPECT_WORKERS_MAX_WAIT_S = 60


class DistributedError(LoadError, ValueError):
    """Invalid distributed settings (worker counts, master address)."""


@dataclass(frozen=True)
class Distribution:
    """How ``zerowindow run`` distributes each user group: ``workers`` local worker processes
    plus ``remote_workers`` that join from elsewhere (``zerowindow worker``); the masters
    listen on ``master_host``, group *i* (in start order) on ``master_port + i``, or on free
    ports when ``master_port`` is 0. Raises :class:`DistributedError` for negative counts, no
    worker at all, or a port out of range."""

    workers: int
    remote_workers: int = 0
    master_host: str = "127.0.0.1"
    master_port: int = 0

    def __post_init__(self) -> None:
        if self.workers < 0 or self.remote_workers < 0:
            raise DistributedError("worker counts cannot be negative")
        if self.workers + self.remote_workers < 1:
            raise DistributedError("--workers/--remote-workers: at least one worker is needed")
        if not 0 <= self.master_port <= 65535:
            raise DistributedError(f"master port {self.master_port} is out of range")

    def for_group(self, index: int) -> dict[str, Any]:
        """Keyword arguments of :func:`start_distributed_load` for the ``index``-th group."""
        port = self.master_port + index if self.master_port else 0
        if port > 65535:
            raise DistributedError(f"master port {port} (group {index + 1}) is out of range")
        return {
            "workers": self.workers,
            "remote_workers": self.remote_workers,
            "master_bind": (self.master_host, port),
        }


@dataclass
class WorkerProcess:
    """A Locust worker this machine started for a group: its ``name`` (``w1``, ``w2``...)."""

    name: str
    argv: list[str]
    proc: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class DistributedLoad(LoadProcess):
    """A group's Locust master (``proc``) and its local workers."""

    master_address: str = ""
    expected_workers: int = 0
    workers: list[WorkerProcess] = field(default_factory=list)

    def stop(self, *, grace_s: float = 10.0) -> int | None:
        """Stop the master (which tells its workers to quit), then any worker still running."""
        code = stop_process_group(self.proc, grace_s=grace_s)
        for worker in self.workers:
            stop_process_group(worker.proc, grace_s=grace_s)
        return code

    def processes(self) -> list[tuple[subprocess.Popen[bytes], str]]:
        return [(self.proc, f"locust master {self.group}")] + [
            (w.proc, f"locust worker {self.group}@{w.name}") for w in self.workers
        ]

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "master_address": self.master_address,
            "expected_workers": self.expected_workers,
            "workers": [
                {"name": w.name, "pid": w.proc.pid, "argv": w.argv, "exit_code": w.proc.poll()}
                for w in self.workers
            ],
        }


def parse_address(text: str, *, default_port: int | None = None) -> tuple[str, int]:
    """``HOST:PORT`` (or ``HOST`` when ``default_port`` is given) as ``(host, port)``.

    Raises :class:`DistributedError` naming the expected form.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, ""
    host = host.strip("[]")
    if not port_text and default_port is not None:
        port_text = str(default_port)
    if not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise DistributedError(f"expected HOST:PORT such as 127.0.0.1:5557, got {text!r}")
    return host, int(port_text)


def check_listen_address(host: str) -> None:
    """Raises :class:`DistributedError` unless this machine can listen on ``host`` (a local
    address or a name resolving to one; ``*`` or ``0.0.0.0`` for every address, as Locust's
    ``--master-bind-host`` takes it), tried as the run will pick the masters' ports
    (:func:`_free_port`): so that a bad ``--master-bind`` is refused before the target
    starts."""
    try:
        _free_port(host)
    except OSError as exc:
        raise DistributedError(f"cannot listen on {host!r}: {exc.strerror or exc}") from None


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host if host not in ("*", "0.0.0.0") else "127.0.0.1", 0))
        return int(s.getsockname()[1])


def _locust() -> list[str]:
    return [sys.executable, "-m", "locust"]


def _start_worker(
    name: str, locustfile: Path, run_dir: Path, group: str, host: str, port: int,
    netns: str | None,
) -> WorkerProcess:  # fmt: skip
    """Start the local Locust worker ``name`` of ``group``'s master at ``host:port``; it writes
    into ``run_dir``. Raises ``OSError`` if it cannot be started."""
    argv = [
        *_locust(), "-f", str(locustfile), "--worker", "--master-host", host,
        "--master-port", str(port),
    ]  # fmt: skip
    log = run_dir / f"locust-{group}@{name}.log"
    env = {WORKER_NAME_ENV: name, WORKER_DIR_ENV: str(run_dir), WORKER_FORWARD_ENV: "0"}
    return WorkerProcess(name, argv, start_process(argv, log_path=log, env=env, netns=netns), log)


def _master_argv(
    locustfile: Path, bind_host: str, port: int, expected: int, host: str, users: int,
    max_duration_s: float, stats: Path,
) -> list[str]:  # fmt: skip
    """The command line of a group's Locust master (its options: Locust's ``--help``)."""
    return [
        *_locust(), "-f", str(locustfile),
        "--master", "--master-bind-host", bind_host, "--master-bind-port", str(port),
        "--expect-workers", str(expected),
        "--expect-workers-max-wait", str(EXPECT_WORKERS_MAX_WAIT_S),
        "--headless", "--host", host, "-u", str(users), "-r", str(users),
        "--run-time", f"{max(1, int(max_duration_s))}s",
        "--stop-timeout", "5", "--only-summary", "--json-file", str(stats),
    ]  # fmt: skip


def _as_workers_get_it(group: UserGroupConfig, seed: int) -> UserGroupConfig:
    """``group`` as the locustfile carries it to workers: workers on other machines cannot read
    a trace file, so a trace's plan is read here and travels whole (``planned``), and so do a
    session file's sessions (``session.recorded``). Raises :class:`~loadgen.TraceError` for an
    unreadable trace, :class:`~loadgen.ConversationError` for an unreadable session file."""
    session = group.session
    if session is not None and session.file is not None:
        carried = session.model_copy(update={"file": None, "recorded": session.sessions()})
        return group.model_copy(update={"session": carried})
    if not isinstance(group.arrival, TraceArrivals):
        return group
    return group.model_copy(update={"arrival": PlannedArrivals.from_trace(group.arrival, seed)})


def start_distributed_load(
    group: UserGroupConfig,
    *,
    run_dir: Path,
    host: str,
    model: str,
    seed: int,
    max_duration_s: float,
    workers: int,
    remote_workers: int = 0,
    master_bind: tuple[str, int] = ("127.0.0.1", 0),
    plugins: list[str] | None = None,
    netns: str | None = None,
) -> DistributedLoad:
    """Write the group's locustfile and start its master and ``workers`` local workers
    (all inside network namespace ``netns``, if given).

    The master listens on ``master_bind`` (port 0 picks a free one) and starts the load once
    ``workers + remote_workers`` workers have connected (it gives up after
    :data:`EXPECT_WORKERS_MAX_WAIT_S`). Local workers write into ``run_dir`` and sample their
    own saturation. Raises :class:`DistributedError` for no workers at all,
    :class:`~loadgen.TraceError` for an unreadable trace (:func:`_as_workers_get_it`) and
    ``OSError`` if a process cannot be started.
    """
    expected = workers + remote_workers
    if workers < 0 or remote_workers < 0 or expected < 1:
        raise DistributedError(
            f"a distributed group needs at least one worker (workers={workers}, "
            f"remote_workers={remote_workers})"
        )
    run = GroupRunConfig(
        group=_as_workers_get_it(group, seed),
        host=host,
        model=model,
        records_path=group_file(run_dir, "records", group.name, None),
        seed=seed,
        plugins=plugins or [],
        processes=expected,
    )
    (run_dir / f"group-{group.name}.json").write_text(run.model_dump_json(indent=2))
    locustfile = run_dir / f"locustfile-{group.name}.py"
    locustfile.write_text(locustfile_source(run))
    bind_host, port = master_bind
    port = port or _free_port(bind_host)
    users = group.locust_users(expected)  # open loop: one dispatcher per worker
    master_argv = _master_argv(
        locustfile, bind_host, port, expected, host, users, max_duration_s,
        run_dir / f"locust-stats-{group.name}",
    )  # fmt: skip
    log_path = run_dir / f"locust-{group.name}.log"
    master = start_process(master_argv, log_path=log_path, netns=netns)
    connect_host = "127.0.0.1" if bind_host in ("*", "0.0.0.0") else bind_host
    load = DistributedLoad(
        group.name,
        master_argv,
        master,
        run.records_path,
        log_path,
        master_address=f"{connect_host}:{port}",
        expected_workers=expected,
    )
    try:
        for i in range(1, workers + 1):
            load.workers.append(
                _start_worker(f"w{i}", locustfile, run_dir, group.name, connect_host, port, netns)
            )
    except OSError:
        load.stop(grace_s=2)
        raise
    if remote_workers:
        # The port may have been picked here: say where remote workers must connect.
        print(
            f"group {group.name}: Locust master on {bind_host}:{port} waits for "
            f"{remote_workers} remote workers: zerowindow worker --master HOST:{port}",
            file=sys.stderr,
            flush=True,
        )
    return load


def _count_lines(path: Path) -> int:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    return data.count(b"\n")


def _read_log(path: Path) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return events
    for line in text.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    return events


def worker_reports(load: LoadProcess, run_dir: Path) -> list[LoadWorker]:
    """One :class:`LoadWorker` per worker of ``load`` (none for a single-process group), from
    the master's ``workers-<group>.jsonl`` and, for local workers, their exit codes."""
    if not isinstance(load, DistributedLoad):
        return []
    group = load.group
    hello: dict[str, dict[str, Any]] = {}
    lost: dict[str, str] = {}
    for event in _read_log(workers_log(run_dir, group)):
        name = event.get("worker")
        if not isinstance(name, str) or not valid_worker_name(name):
            continue
        kind = event.get("event")
        if kind == "hello":
            hello[name] = event
        elif kind == "missing":
            lost[name] = "stopped sending heartbeats to its master"
        elif kind == "back":
            lost.pop(name, None)
    reports: list[LoadWorker] = []
    local = {w.name: w for w in load.workers}
    clocks = clock_estimates(run_dir, group)
    for name in sorted(set(hello) | set(local), key=_natural):
        info = hello.get(name, {})
        proc = local[name].proc if name in local else None
        detail = exit_detail(proc.poll()) if proc is not None else None
        if detail is None:
            detail = lost.get(name)
        status: Literal["finished", "died", "never_joined"]
        if name not in hello:
            status, detail = "never_joined", detail or "never joined its master"
        elif detail is not None:
            status = "died"
        else:
            status, detail = "finished", "finished"
        if info.get("asked"):  # a remote worker whose name was taken
            detail += f" (it asked for the name {info['asked']}, taken)"
        reports.append(
            LoadWorker(
                group=group,
                worker=name,
                host=info.get("host"),
                pid=info.get("pid") or (proc.pid if proc is not None else None),
                status=status,
                detail=detail,
                requests_recorded=_count_lines(group_file(run_dir, "records", group, name)),
                clock=WorkerClock(**clocks[name].as_dict()) if name in clocks else None,
            )
        )
    remote_missing = load.expected_workers - len(hello)
    if remote_missing > 0 and len(hello) >= len(local):
        reports.append(
            LoadWorker(
                group=group,
                worker=f"({remote_missing} remote)",
                host=None,
                pid=None,
                status="never_joined",
                requests_recorded=0,
                detail=f"never joined its master ({len(hello)} of "
                f"{load.expected_workers} workers did)",
            )  # fmt: skip
        )
    return reports


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def default_worker_name() -> str:
    """``<hostname>-<pid>``, reduced to the characters a worker name allows."""
    host = re.sub(r"[^A-Za-z0-9_.-]+", "-", socket.gethostname()).strip("-.") or "worker"
    return f"{host[:50]}-{os.getpid()}"


def run_worker(master: str, *, out_dir: Path, name: str | None = None) -> int:
    """Join the Locust master at ``master`` (``HOST:PORT``) as one worker, in the foreground,
    until the master quits it; returns Locust's exit code.

    The worker receives the master's locustfile (``locust -f - --worker``), writes its
    records and saturation samples under ``out_dir`` and forwards every line to the master,
    which writes them into the run folder. ``name`` (default :func:`default_worker_name`)
    names its files. Raises :class:`DistributedError` for a bad address or name and
    ``OSError`` if Locust cannot be started.
    """
    host, port = parse_address(master)
    name = name or default_worker_name()
    if not valid_worker_name(name):
        raise DistributedError(
            f"invalid worker name {name!r}: 1 to 64 letters, digits, '_', '.', '-'"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [*_locust(), "-f", "-", "--worker", "--master-host", host, "--master-port", str(port)]
    env = {
        **os.environ,
        WORKER_NAME_ENV: name,
        WORKER_DIR_ENV: str(out_dir.resolve()),
        WORKER_FORWARD_ENV: "1",
    }
    proc = subprocess.Popen(argv, env=env, cwd=out_dir)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)
        try:
            return proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()
