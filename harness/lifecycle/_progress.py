"""Live progress of a run: phase, elapsed and remaining time, finished requests, live TTFT p50
per group, KV cache usage.

Fed by the run loop (the run's life cycle calls :meth:`RunProgress.update` every
time it polls, about 5 times a second); reads only what the run has anyway: the
``records-<group>.jsonl`` files the load processes append to (tailed from the last offset, only
the fields before each record's chunk list are parsed) and the metrics scraper's latest sample.
The files are read at most every ``poll_s`` seconds, so the run loop is not slowed.

On a terminal it draws a ``rich.live.Live`` panel (refreshed twice a second by rich's own
thread, which only renders the last snapshot); otherwise it prints one plain line when the
phase changes and every ``interval_s`` seconds, for CI logs.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from harness.runfolder import records_files
from loadgen import LineTail, ttft_ms

# Records are JSON objects whose scalar fields come before the (long) chunk list.
_CHUNKS_KEY = ',"chunks":'


def _record_head(line: bytes) -> dict[str, Any] | None:
    """The scalar fields of one record line (``None`` for a line that is not a record)."""
    text = line.decode("utf-8", errors="replace")
    cut = text.find(_CHUNKS_KEY)
    try:
        head = json.loads(text[:cut] + "}" if cut > 0 else text)
    except ValueError:
        try:
            head = json.loads(text)
        except ValueError:
            return None
    return head if isinstance(head, dict) else None


LINE_GROUPS_MAX = 6
"""Groups a plain progress line names at most (the latest that finished requests)."""


@dataclass
class _GroupState:
    finished: int = 0
    ttft_ms: list[float] = field(default_factory=list)

    def ttft_p50_ms(self) -> float | None:
        return statistics.median(self.ttft_ms) if self.ttft_ms else None


@dataclass(frozen=True)
class _Snapshot:
    phase: str
    t_now: float
    elapsed_s: float
    remaining_s: float | None
    groups: dict[str, tuple[int, float | None]]  # group -> (finished, TTFT p50 ms)
    kv_perc: float | None
    running: float | None
    waiting: float | None


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


class RunProgress:
    """Progress display of one run; see the module docstring.

    ``console`` defaults to stdout; ``live`` defaults to whether the console is a terminal.
    ``interval_s`` is the time between plain lines, ``poll_s`` between reads of the files.
    Use :meth:`start` before the run, :meth:`update` from its loop and :meth:`stop` after it
    (also on errors). Never raises for unreadable records: progress is best effort.
    """

    def __init__(
        self,
        console: Console | None = None,
        *,
        live: bool | None = None,
        interval_s: float = 5.0,
        poll_s: float = 1.0,
    ) -> None:
        self.console = console or Console()
        self.live = self.console.is_terminal if live is None else live
        self.interval_s = interval_s
        self.poll_s = poll_s
        self._scenario = ""
        self._max_duration_s = 0.0
        self._tails: dict[str, dict[Path, LineTail]] = {}
        self._groups: dict[str, _GroupState] = {}
        self._group_view: dict[str, tuple[int, float | None]] = {}
        self._t_start = time.monotonic()
        self._t_load: float | None = None
        self._t_polled = 0.0
        self._t_printed = 0.0
        self._metrics: dict[str, Any] | None = None
        self._snapshot: _Snapshot | None = None
        self._phase = ""
        self._live: Live | None = None

    def start(
        self, *, scenario: str, run_dir: Path, groups: Iterable[str], max_duration_s: float
    ) -> None:
        """Begin showing the run ``scenario`` writing into ``run_dir``."""
        self._scenario = scenario
        self._max_duration_s = max_duration_s
        self._t_start = time.monotonic()
        self._run_dir: Path = run_dir
        for g in groups:
            self._tails[g] = {}
            self._groups[g] = _GroupState()
        self._group_view = {g: (0, None) for g in self._groups}
        self._snapshot = self._take_snapshot()
        if self.live:
            self._live = Live(
                get_renderable=self._render,
                console=self.console,
                refresh_per_second=2,
                transient=False,
                redirect_stdout=False,
                redirect_stderr=False,
            )
            self._live.start()

    def update(
        self, phase: str, *, t_load: float | None = None, metrics: dict[str, Any] | None = None
    ) -> None:
        """Called from the run loop: the current ``phase``, when the load phase began
        (monotonic s, ``None`` before) and the scraper's latest sample (``kv_cache_usage`` in
        0..1, ``num_requests_running``, ``num_requests_waiting``)."""
        now = time.monotonic()
        changed = phase != self._phase
        self._phase, self._t_load = phase, t_load
        if metrics is not None and metrics.get("scrape_ok"):
            self._metrics = metrics
        if changed or now - self._t_polled >= self.poll_s:
            self._t_polled = now
            self._poll()
        self._snapshot = self._take_snapshot()
        if self._live is None and (changed or now - self._t_printed >= self.interval_s):
            self._print_line()

    def stop(self) -> None:
        """Stop the display (a final plain line off a terminal). Safe to call twice."""
        self._poll()
        self._phase = "done"
        self._snapshot = self._take_snapshot()
        if self._live is not None:
            self._live.update(self._render(), refresh=True)
            self._live.stop()
            self._live = None
        elif self._tails:
            self._print_line()
        self._tails = {}

    # -- internals ----------------------------------------------------------------------

    def _group_lines(self, group: str) -> list[bytes]:
        """New record lines of ``group``: from its one load process's file, or from each of its
        workers' files (``--workers``), which appear while the run goes on."""
        tails = self._tails[group]
        lines: list[bytes] = []
        for path in records_files(self._run_dir, group):
            tail = tails.setdefault(path, LineTail(path))
            try:
                lines += [ln for ln in tail.new_data().split(b"\n") if ln.strip()]
            except OSError:
                continue
        return lines

    def _poll(self) -> None:
        for group in self._tails:
            lines = self._group_lines(group)
            state = self._groups[group]
            for line in lines:
                head = _record_head(line)
                if head is None:
                    continue
                state.finished += 1
                t_send, t_first = head.get("t_send"), head.get("t_first_token")
                if not isinstance(t_send, int | float) or not isinstance(t_first, int | float):
                    continue
                if (ttft := ttft_ms(t_send, t_first)) is not None:
                    state.ttft_ms.append(ttft)
        # Medians only after new records, not on every call from the run loop.
        self._group_view = {g: (s.finished, s.ttft_p50_ms()) for g, s in self._groups.items()}

    def _take_snapshot(self) -> _Snapshot:
        now = time.monotonic()
        remaining = None
        if self._t_load is not None and self._phase == "load":
            remaining = max(0.0, self._t_load + self._max_duration_s - now)
        m = self._metrics or {}
        kv = m.get("kv_cache_usage")
        return _Snapshot(
            phase=self._phase,
            t_now=now,
            elapsed_s=now - self._t_start,
            remaining_s=remaining,
            groups=self._group_view,
            kv_perc=None if kv is None else float(kv) * 100.0,
            running=m.get("num_requests_running"),
            waiting=m.get("num_requests_waiting"),
        )

    def line(self) -> str:
        """The current state as one plain line."""
        s = self._snapshot or self._take_snapshot()
        finished = sum(n for n, _ in s.groups.values())
        shown = list(s.groups.items())
        if len(shown) > LINE_GROUPS_MAX:  # a matrix has dozens: those that finished something
            shown = [(g, v) for g, v in shown if v[0]][-LINE_GROUPS_MAX:]
        per_group = ", ".join(f"{g} {n} (TTFT p50 {_f(p50, '.0f')} ms)" for g, (n, p50) in shown)
        if len(shown) < len(s.groups):
            per_group = f"{per_group} (last {len(shown)} of {len(s.groups)} groups)"
        left = "" if s.remaining_s is None else f", at most {s.remaining_s:.0f} s left"
        return (
            f"[{s.elapsed_s:6.1f} s] {self._scenario}: {s.phase}{left}; "
            f"{finished} requests finished: {per_group}; KV cache {_f(s.kv_perc, '.1f')} %, "
            f"running {_f(s.running, '.0f')}, waiting {_f(s.waiting, '.0f')}"
        )

    def _print_line(self) -> None:
        self._t_printed = time.monotonic()
        self.console.print(self.line(), markup=False, highlight=False, soft_wrap=True)

    def _render(self) -> Table:
        s = self._snapshot or self._take_snapshot()
        elapsed = s.elapsed_s + (time.monotonic() - s.t_now)
        head = Table.grid(padding=(0, 2))
        left = "-" if s.remaining_s is None else f"≤ {s.remaining_s:.0f} s"
        head.add_row(
            f"[bold]{self._scenario}[/bold]",
            f"phase [cyan]{s.phase}[/cyan]",
            f"elapsed {elapsed:.0f} s",
            f"remaining {left}",
            f"KV cache {_f(s.kv_perc, '.1f')} %",
            f"running {_f(s.running, '.0f')}",
            f"waiting {_f(s.waiting, '.0f')}",
        )
        groups = Table(box=None, padding=(0, 2), show_edge=False)
        for col in ("group", "finished", "TTFT p50 ms"):
            groups.add_column(col, justify="left" if col == "group" else "right")
        for g, (n, p50) in s.groups.items():
            groups.add_row(g, str(n), _f(p50, ",.1f"))
        outer = Table.grid()
        outer.add_row(head)
        outer.add_row(groups)
        return outer
