"""The bench SSE server (:mod:`harness.benchmarks._sse_server`) as a child of a benchmark,
pinned to the server's CPU, with the stats lines it prints collected by a thread; and the
CPUs the client benchmarks put the server and the client on."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from harness.benchmarks._common import (
    BenchError,
    Children,
    module_argv,
    pin_argv,
    placement,
    raise_nofile,
)


def bench_cpus() -> tuple[int | None, int | None]:
    """(server CPU, client CPU), or (None, None) on a machine with one CPU."""
    pair = placement()
    return pair if pair is not None else (None, None)


class SseServer:
    """The bench SSE server as a child process of ``children``, its stats lines collected by a
    thread. Raises :class:`BenchError` when it does not say where it listens."""

    def __init__(
        self, children: Children, *, events: int, interval_ms: float, loop: str = "asyncio"
    ) -> None:
        raise_nofile()
        argv = [
            *pin_argv(bench_cpus()[0]),
            *module_argv(
                "harness.benchmarks._sse_server", "--port", "0", "--events", str(events),
                "--interval-ms", str(interval_ms), "--loop", loop, "--stats-interval-s", "0.5",
            ),
        ]  # fmt: skip
        self.proc = children.start(argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        try:
            self.port = int(json.loads(line)["listening"])
        except (ValueError, KeyError):
            raise BenchError(f"the bench SSE server did not start: {line.strip()!r}") from None
        self.stats: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                try:
                    self.stats.append(json.loads(line))
                except ValueError:
                    pass
        except (OSError, ValueError):  # closed by Children.stop
            pass

    def latest(self) -> dict[str, Any]:
        """The last stats line (``open``, ``started``, ``finished``, ``events``...), or zeros
        before the first."""
        return self.stats[-1] if self.stats else {"open": 0, "events": 0}
