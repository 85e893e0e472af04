"""Locust's distributed mode for zerowindow load processes: workers' files and the master's log.

Locust runs one master (no users of its own) and N workers; the master hands users out and
quits everybody at the end (https://docs.locust.io/en/stable/running-distributed.html). Two
things Locust does not do are added here, with Locust's own custom messages
(``runner.send_message`` / ``register_message``):

- the master keeps a log of its workers (``workers-<group>.jsonl``: each worker's name, host
  and pid as it announced them, when it went missing, came back or left), so that a run can
  say which worker died;
- a worker on another machine (``ZW_WORKER_FORWARD=1``) sends every complete line it appends
  to its records and saturation files to the master, which appends them to the same file
  names in the run folder. Lines are forwarded every ``forward_interval_s`` and right before
  each of the worker's statistics reports, so the master has all records of a worker before
  it sees that worker's users stopped;
- the master measures each forwarding worker's clock against its own (the harness's), in
  bursts of pings (``loadgen._clock``), and logs every answer, so that the worker's records can
  be moved onto the harness's clock.

Importing this module imports Locust (and gevent's monkey-patching).
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment
from locust.runners import STATE_MISSING, MasterRunner, WorkerRunner

from . import _clock
from ._tail import LineTail
from ._users import schedule_starts_at
from ._workers import FILE_KINDS, WorkerIdentity, group_file, valid_worker_name, workers_log

HELLO = "zw_hello"
_LOCAL_NAME = re.compile(r"^w[0-9]+$")  # the harness's own workers: w1, w2, ...
LINES = "zw_lines"
logger = logging.getLogger(__name__)


def collect_on_master(
    environment: Environment, *, run_dir: Path, group: str, poll_s: float = 0.5
) -> None:
    """On a master runner: log workers to ``workers-<group>.jsonl`` and write the lines that
    forwarding workers send into ``run_dir``. Does nothing on other runners.

    Each log line is ``{"t": <monotonic s>, "event": E, "client_id": ..., ...}`` with ``E`` one
    of ``connected``, ``hello`` (with ``worker``, ``host``, ``pid``, ``forward``), ``missing``
    (no heartbeat for 3 s), ``back`` (heartbeats again), ``left`` (gone from the master's
    list), ``clock`` (a forwarding worker's answer to a clock ping: ``burst``, ``offset_s``,
    ``rtt_s``, see ``loadgen._clock``), ``lines`` is not logged; ``end`` (at quitting:
    ``workers`` maps every known client id to its state).
    """
    runner = environment.runner
    if not isinstance(runner, MasterRunner):
        return
    master = _MasterCollector(runner, run_dir=run_dir, group=group)
    runner.register_message(HELLO, master.on_hello)
    runner.register_message(LINES, master.on_lines)
    runner.register_message(_clock.PONG, master.on_pong)
    environment.events.worker_connect.add_listener(
        lambda client_id, **_kw: master.log("connected", client_id)
    )
    environment.events.spawning_complete.add_listener(lambda **_kw: master.start_schedules())
    watcher = gevent.spawn(master.watch, poll_s)

    def on_quitting(**_kwargs: Any) -> None:
        watcher.kill(block=True)
        gevent.killall(list(master.pingers), block=True)
        master.close()

    environment.events.quitting.add_listener(on_quitting)


class _MasterCollector:
    """The master's side of :func:`collect_on_master`: the workers' log (opened here, closed by
    :meth:`close`) and the files the forwarded lines are appended to."""

    def __init__(self, runner: MasterRunner, *, run_dir: Path, group: str) -> None:
        self.runner = runner
        self.run_dir = run_dir
        self.group = group
        log_path = workers_log(run_dir, group)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.names: dict[str, str] = {}  # client id: worker name
        self.files: dict[tuple[str, str], int] = {}  # (file kind, worker name): descriptor
        self.pingers: list[gevent.Greenlet] = []
        self.samples: dict[str, list[dict[str, float | int]]] = {}  # client id: clock samples

    def log(self, event: str, client_id: str | None, **fields: Any) -> None:
        """Append one line to the workers' log."""
        line = {"t": round(time.monotonic(), 4), "event": event, "client_id": client_id}
        line.update(fields)
        if client_id in self.names:
            line.setdefault("worker", self.names[client_id])
        os.write(self.log_fd, (json.dumps(line) + "\n").encode())

    def on_hello(self, msg: Any, **_kwargs: Any) -> None:
        """A worker announced its name, host, pid and whether it forwards its lines."""
        data = msg.data or {}
        name = str(data.get("worker", ""))
        if not valid_worker_name(name):
            logger.warning("worker %s announced an invalid name %r", msg.node_id, name)
            return
        asked = name
        if data.get("forward"):  # its lines land under the name given here: never a taken one
            name = self._free_name(name)
            if name != asked:
                logger.warning("worker %s asked for the name %r, taken: it is %r", msg.node_id,
                               asked, name)  # fmt: skip
        self.names[msg.node_id] = name
        extra = {"asked": asked} if name != asked else {}
        self.log("hello", msg.node_id, worker=name, host=data.get("host"), pid=data.get("pid"),
                 forward=bool(data.get("forward")), **extra)  # fmt: skip
        if data.get("forward"):  # on another machine, or at least another clock
            self.pingers.append(gevent.spawn(self.ping, msg.node_id))

    def _free_name(self, name: str) -> str:
        """``name``, or ``<name>-<k>`` with the smallest k from 2 that is free, when a worker
        already announced it or it is the form of the harness's own workers (``w<N>``, which
        write into the run folder themselves)."""
        taken = set(self.names.values())
        if name not in taken and not _LOCAL_NAME.match(name):
            return name
        k = 2
        while f"{name}-{k}" in taken:
            k += 1
        return f"{name}-{k}"

    def ping(self, client_id: str) -> None:
        """Send ``client_id`` a burst of clock pings now and every ``BURST_INTERVAL_S``, for
        as long as the master knows it (the greenlet is killed at quitting)."""
        burst = 0
        while client_id in self.runner.clients:
            for _ in range(_clock.PINGS_PER_BURST):
                self.runner.send_message(
                    _clock.PING, _clock.ping(burst, time.monotonic()), client_id=client_id
                )
                gevent.sleep(_clock.PING_SPACING_S)
            burst += 1
            gevent.sleep(_clock.BURST_INTERVAL_S)

    def on_pong(self, msg: Any, **_kwargs: Any) -> None:
        """A worker answered a clock ping: log the sample (offset and round trip)."""
        t1 = time.monotonic()
        try:
            measured = _clock.sample(msg.data or {}, t1)
        except (KeyError, TypeError, ValueError):
            logger.warning("discarded a malformed clock answer from %s", msg.node_id)
            return
        if msg.node_id in self.names:
            self.log(_clock.CLOCK_EVENT, msg.node_id, **measured)
            self.samples.setdefault(msg.node_id, []).append(measured)

    def start_schedules(self) -> None:
        """Every worker has spawned: tell each when the shared open-loop schedule starts, on
        its own clock (the harness's moment plus its measured offset; 0 for a worker on the
        harness's clock), so that the workers' shares interleave as the schedule says."""
        t_start = time.monotonic() + _clock.START_MARGIN_S
        self.log("schedule_start", None, t_start=round(t_start, 6))
        for client_id in list(self.runner.clients):
            clock = _clock.estimate(self.samples.get(client_id, []))
            offset = clock.offset_s if clock is not None else 0.0
            self.runner.send_message(
                _clock.SCHEDULE_START, {"t0": t_start + offset}, client_id=client_id
            )

    def on_lines(self, msg: Any, **_kwargs: Any) -> None:
        """Append the lines an announced worker forwarded to its file of their kind."""
        data = msg.data or {}
        kind, name = data.get("kind"), self.names.get(msg.node_id)
        if kind not in FILE_KINDS or name is None:
            logger.warning("discarded %s lines from unannounced worker %s", kind, msg.node_id)
            return
        fd = self.files.get((kind, name))
        if fd is None:
            path = group_file(self.run_dir, kind, self.group, name)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self.files[(kind, name)] = fd
        os.write(fd, "".join(data.get("lines", [])).encode())

    def watch(self, poll_s: float) -> None:
        """Log workers going missing, coming back and leaving, every ``poll_s`` s (forever: the
        greenlet is killed at quitting)."""
        seen: dict[str, str] = {}
        while True:
            current = {cid: node.state for cid, node in self.runner.clients.items()}
            for cid, state in current.items():
                was = seen.get(cid)
                if state == STATE_MISSING and was != STATE_MISSING:
                    self.log("missing", cid)
                elif was == STATE_MISSING and state != STATE_MISSING:
                    self.log("back", cid, state=state)
            for cid in set(seen) - set(current):
                self.log("left", cid)
            seen = current
            gevent.sleep(poll_s)

    def close(self) -> None:
        """Log the end (every known worker's state) and close the log and the files."""
        states = {cid: node.state for cid, node in self.runner.clients.items()}
        self.log("end", None, workers={self.names.get(c, c): s for c, s in states.items()})
        for fd in (*self.files.values(), self.log_fd):
            os.close(fd)


def announce_and_forward(
    environment: Environment,
    *,
    worker: WorkerIdentity,
    group: str,
    forward_interval_s: float = 0.5,
) -> None:
    """On a worker runner: announce ``worker`` to the master and, when ``worker.forward``,
    forward the new complete lines of its records and saturation files. Does nothing on other
    runners."""
    runner = environment.runner
    if not isinstance(runner, WorkerRunner):
        return
    runner.register_message(
        _clock.SCHEDULE_START,
        lambda msg, **_kw: schedule_starts_at(float((msg.data or {})["t0"])),
    )
    runner.register_message(
        _clock.PING,
        lambda msg, **_kw: runner.send_message(
            _clock.PONG, _clock.pong(msg.data or {}, time.monotonic())
        ),
    )
    runner.send_message(
        HELLO,
        {"worker": worker.name, "host": socket.gethostname(), "pid": os.getpid(),
         "forward": worker.forward},
    )  # fmt: skip
    if not worker.forward:
        return
    tails = {
        kind: LineTail(group_file(worker.out_dir, kind, group, worker.name)) for kind in FILE_KINDS
    }

    def forward() -> None:
        for kind, tail in tails.items():
            lines = tail.new_data().decode("utf-8", errors="replace").splitlines(keepends=True)
            if lines:
                runner.send_message(LINES, {"kind": kind, "lines": lines})

    def loop() -> None:
        while True:
            gevent.sleep(forward_interval_s)
            _guard(forward)

    forwarder = gevent.spawn(loop)
    environment.events.report_to_master.add_listener(lambda **_kw: _guard(forward))
    environment.events.quitting.add_listener(lambda **_kw: forwarder.kill(block=False))


def _guard(fn: Callable[[], None]) -> None:
    try:
        fn()
    except Exception as exc:  # forwarding must never kill the worker's reporting
        logger.warning("forwarding lines to the master failed: %s", exc)
