"""Client-saturation sampling: is this load process itself the bottleneck?

Latency figures are only as good as the client that takes them. A load process that is short
of CPU, or whose gevent hub is late to run ready greenlets, reads several SSE events in one
``recv`` and timestamps them together: ITL collapses towards 0 and the gaps it does see grow.
This hook records, every ``interval_s``, the process's CPU use and the hub's loop lag, so that
the harness can flag a run whose client was saturated (``harness.analysis._saturation``).

Each sample is one JSON line appended to the file (one ``write`` per line, ``O_APPEND``, so
several processes, e.g. Locust workers, may share a file; ``pid`` tells them apart)::

    {"t": 12345.678, "pid": 4242, "cpu_pct": 37.5, "loop_lag_ms": 0.21}

- ``t``: ``time.monotonic()`` at the end of the interval, in seconds;
- ``cpu_pct``: CPU time (user + system, all threads, ``time.process_time()``) used over the
  interval, in percent of one core (may exceed 100 with threads);
- ``loop_lag_ms``: how late the sampler's ``gevent.sleep`` woke up, in ms (0 if on time): how
  long a greenlet whose socket became readable at that moment waited for the hub to run it.
  An idle process shows about 0.2 to 1 ms (libev's timer slack and ``epoll_wait``'s
  millisecond resolution). Each sleep lasts ``interval_s`` times a random factor in 0.8..1.2,
  so that wake-ups do not lock in phase with a periodic load (a user that computes for 20 ms
  every 20 ms would otherwise be seen always at the same point of its cycle): the fraction of
  samples with a lag above L then estimates the fraction of time the loop was late by more
  than L.

The harness asks for sampling through the environment variable ``ZW_SATURATION`` (the path of
the file); ``loadgen/locustfile.py`` passes it to :func:`sample_saturation`.
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from pathlib import Path
from typing import Any

import gevent
from locust.env import Environment

from ._config import SATURATION_ENV

ENV_VAR = SATURATION_ENV

logger = logging.getLogger(__name__)


def sample_saturation(
    environment: Environment,
    *,
    path: str | os.PathLike[str] | None,
    interval_s: float = 0.5,
) -> None:
    """Sample this process's CPU use and gevent loop lag every ``interval_s`` (on average)
    until quitting.

    Call it from an ``init`` (or ``spawning_complete``) listener: sampling starts at once, in a
    greenlet, and stops on the ``quitting`` event (the last, partial interval is not written).
    ``path`` is the JSON-lines file to append to (its folder is created); ``None`` or ``""``
    does nothing. Raises ``ValueError`` if ``interval_s`` is not positive and ``OSError`` if
    the file cannot be opened.
    """
    if not path:
        return
    if interval_s <= 0:
        raise ValueError(f"interval_s must be positive, got {interval_s}")
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sampler = gevent.spawn(_sample, fd, interval_s, str(file), random.Random())

    def stop(**_kwargs: Any) -> None:
        sampler.kill(block=True)
        os.close(fd)

    environment.events.quitting.add_listener(stop)


def _sample(fd: int, interval_s: float, name: str, rng: random.Random) -> None:
    pid = os.getpid()
    loop = gevent.get_hub().loop
    last_wall = time.monotonic()
    last_cpu = time.process_time()
    while True:
        # libev arms timers from its cached "now", which is stale when the loop has been busy:
        # refresh it so that the timer is due exactly interval_s from here.
        loop.update_now()
        start = time.monotonic()
        sleep_s = interval_s * rng.uniform(0.8, 1.2)
        gevent.sleep(sleep_s)
        wall = time.monotonic()
        cpu = time.process_time()
        lag_ms = max(0.0, (wall - start - sleep_s) * 1000.0)
        cpu_pct = 100.0 * (cpu - last_cpu) / (wall - last_wall)
        last_wall, last_cpu = wall, cpu
        sample = {
            "t": round(wall, 4),
            "pid": pid,
            "cpu_pct": round(cpu_pct, 2),
            "loop_lag_ms": round(lag_ms, 3),
        }
        try:
            os.write(fd, (json.dumps(sample) + "\n").encode())
        except OSError as e:
            logger.warning("saturation sampling stopped: cannot write %s: %s", name, e)
            return
