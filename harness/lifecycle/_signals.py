"""SIGINT, SIGTERM and SIGHUP during a run: the first one unwinds the run into its clean-up,
later ones are ignored so that the clean-up finishes. SIGHUP (the terminal closed) counts too:
the run's servers and load processes run in sessions of their own, which a hang-up does not
reach, so the run must stop them itself."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class RunInterrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived during a run."""


@contextmanager
def signals_raise() -> Iterator[list[str]]:
    """Turn the first SIGINT/SIGTERM/SIGHUP into :class:`RunInterrupted`; ignore later ones so
    that clean-up finishes. Yields a list that receives the signal names."""
    received: list[str] = []
    owner = os.getpid()

    def handler(signum: int, frame: FrameType | None) -> None:
        if os.getpid() != owner:
            # A forked child (pyroute2 forks to enter namespaces) inherits this handler; the
            # exception would unwind the child through the run's clean-up. It just exits.
            os._exit(128 + signum)
        received.append(signal.Signals(signum).name)
        if len(received) == 1:
            raise RunInterrupted(received[0])

    previous = {s: signal.signal(s, handler) for s in SIGNALS}
    try:
        yield received
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
