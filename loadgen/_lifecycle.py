"""How a Locust process running finite users ends, and with which exit code.

Locust 2.x does not quit when every user has stopped (``StopUser``): the runner stays in the
``running`` state with 0 users until ``--run-time`` or a signal. And by default the process
exits with ``--exit-code-on-error`` (1) as soon as any request failed. For a load generator
whose failed requests are data, both are wrong; these hooks fix them for one process.
"""

from __future__ import annotations

import logging
from typing import Any

import gevent
from locust import log
from locust.env import Environment
from locust.runners import WorkerRunner

logger = logging.getLogger(__name__)


def quit_when_users_done(environment: Environment, *, poll_s: float = 0.2) -> None:
    """Quit the runner (headless) or stop the test (web UI) once all users have stopped.

    Watching starts at the first ``spawning_complete`` event; then every ``poll_s`` seconds
    the runner's live user count is checked. On a Locust master that count is the sum of its
    workers' reports, and quitting the master quits its workers; a worker never quits by
    itself (its master does it). Locust's workers report every ``WORKER_REPORT_INTERVAL``
    (3 s, locust/runners.py); a worker whose users have all stopped reports at once, so that
    its master quits within ``poll_s`` of the last user, not up to 3 s later (its report
    fires ``report_to_master`` first: a forwarding worker's last lines still reach the master
    before its user count does, ``loadgen._distributed``).
    """
    started = False

    def watch() -> None:
        runner = environment.runner
        if runner is None:
            return
        while runner.user_count > 0:
            gevent.sleep(poll_s)
        if isinstance(runner, WorkerRunner):
            try:
                runner._send_stats()  # Locust's own report (stats_reporter), sent now
            except Exception:  # noqa: BLE001 - the periodic report still comes
                logger.warning("could not report the end of this worker's users at once")
            return
        options = environment.parsed_options
        if options is None or getattr(options, "headless", False):
            runner.quit()
        else:
            runner.stop()

    def on_spawning_complete(**_kwargs: Any) -> None:
        nonlocal started
        if not started:
            started = True
            gevent.spawn(watch)

    environment.events.spawning_complete.add_listener(on_spawning_complete)


def exit_zero_on_request_failures(environment: Environment) -> None:
    """Make the process exit 0 even though requests failed, unless code crashed.

    On ``quitting``, sets ``environment.process_exit_code = 0`` when the runner logged no
    exception from user code and no greenlet died unhandled; otherwise Locust's own rule applies
    (``--exit-code-on-error``, or 2). Failed requests remain visible in the stats and records.
    """

    def on_quitting(environment: Environment, **_kwargs: Any) -> None:
        runner = environment.runner
        crashed = bool(runner is not None and runner.exceptions) or log.unhandled_greenlet_exception
        if not crashed and environment.process_exit_code is None:
            environment.process_exit_code = 0

    environment.events.quitting.add_listener(on_quitting)
