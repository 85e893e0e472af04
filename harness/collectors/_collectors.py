"""Collectors: background samplers of the server's Prometheus metrics and of its TCP sockets.

Each collector is a thread that samples at a fixed interval into memory until stopped; the
run writes what they gathered even when it ends early. Timestamps are ``time.monotonic()``
seconds, the clock the load generator's records use.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Protocol

import httpx
import psutil

from netem import TcpDiag
from zwcore import http_client


class MetricsReader(Protocol):
    """How the run's target reads: the figures of its ``/metrics`` answer by its kind's own
    metric names, and the figures a run looks for (``harness.servers.Target`` is one)."""

    def read_metrics(self, text: str) -> dict[str, float]:
        """The figures of a Prometheus exposition; raises ``ValueError`` for other text."""
        ...

    def expected_figures(self) -> list[str]:
        """The figures a run looks for; those never read are reported missing."""
        ...


class Sampler(threading.Thread):
    """A daemon thread that calls :meth:`sample` every ``interval_s`` seconds until
    :meth:`stop`; subclasses implement ``sample``."""

    def __init__(self, interval_s: float, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.interval_s = interval_s
        self._stop_event = threading.Event()

    def sample(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def run(self) -> None:
        next_t = time.monotonic()
        while not self._stop_event.is_set():
            self.sample()
            next_t += self.interval_s
            self._stop_event.wait(max(0.0, next_t - time.monotonic()))

    def stop(self) -> None:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=10)


def slot_figures(slots: Any) -> dict[str, float]:
    """``slots_busy`` and ``slots_total`` from llama-server's ``GET /slots`` (a JSON list with
    one object per slot, ``is_processing`` true while the slot holds a task: tools/server of
    llama.cpp), and ``kv_cache_usage`` as their ratio (each slot owns its share of the context's
    KV cells). Raises ``ValueError`` for another shape."""
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise ValueError("/slots did not answer a list of slot objects")
    busy = sum(1 for s in slots if s.get("is_processing"))
    total = len(slots)
    return {
        "slots_busy": busy,
        "slots_total": total,
        "kv_cache_usage": busy / total if total else 0.0,
    }


def process_figures(pid: int) -> dict[str, float]:
    """``server_threads`` and ``server_rss_bytes`` of process ``pid`` (psutil). Raises
    ``psutil.Error`` when the process is gone."""
    proc = psutil.Process(pid)
    with proc.oneshot():
        return {"server_threads": proc.num_threads(), "server_rss_bytes": proc.memory_info().rss}


class MetricsScraper(Sampler):
    """Scrapes ``{base_url}/metrics`` every ``interval_s`` seconds, read by ``reader`` (the
    run's target: its kind's own metric names; :class:`MetricsReader`); with ``slots``, also
    ``{base_url}/slots`` (llama-server: :func:`slot_figures`, whose KV usage fills in for a
    /metrics without one); with ``pid``, that process's threads and RSS
    (:func:`process_figures`).

    ``rows`` holds one dict per scrape: ``t`` (monotonic s), ``scrape_ok`` and the figures
    ``reader`` read (and those of the other two). ``consecutive_failures`` counts scrapes
    in a row that got no answer; ``last_error`` says what the last failed one got.
    """

    def __init__(
        self,
        base_url: str,
        *,
        reader: MetricsReader,
        interval_s: float = 0.25,
        slots: bool = False,
        pid: int | None = None,
    ) -> None:
        super().__init__(interval_s, "zw-metrics")
        self.base_url = base_url
        self.reader = reader
        self.slots = slots
        self.pid = pid
        self.rows: list[dict[str, Any]] = []
        self.consecutive_failures = 0
        self.last_error: str | None = None
        self._client = http_client(timeout=max(1.0, interval_s * 4))

    def sample(self) -> None:
        t = time.monotonic()
        extra: dict[str, float] = {}
        if self.pid is not None:
            try:
                extra = process_figures(self.pid)
            except psutil.Error:
                self.pid = None  # gone: the target's failure check says so
        try:
            response = self._client.get(f"{self.base_url}/metrics")
            response.raise_for_status()
            figures = self.reader.read_metrics(response.text)
            if self.slots:
                answer = self._client.get(f"{self.base_url}/slots")
                answer.raise_for_status()
                figures = {**slot_figures(answer.json()), **figures}
        except (httpx.HTTPError, ValueError) as exc:
            self.consecutive_failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.rows.append({"t": t, "scrape_ok": False, **extra})
            return
        self.consecutive_failures = 0
        self.rows.append({"t": t, "scrape_ok": True, **figures, **extra})

    def missing(self) -> list[str]:
        """The figures the reader expects that the server never reported in any scrape."""
        expected = self.reader.expected_figures()
        seen = {k for row in self.rows for k in row}
        return [name for name in expected if name not in seen]

    def stop(self) -> None:
        super().stop()
        self._client.close()


SOCKET_COLUMNS = [
    "t", "local_port", "client_addr", "client_port", "state", "send_q_bytes", "recv_q_bytes",
    "snd_wnd_bytes", "rtt_ms", "retransmits", "zero_window_probes", "busy_ms",
    "rwnd_limited_ms", "sndbuf_limited_ms",
]  # fmt: skip


class SocketSampler(Sampler):
    """Samples the server's TCP connections on ``ports`` (the target's and the proxy's
    listening ports) every ``interval_s`` seconds through ``inet_diag`` (:mod:`netem._diag`),
    inside network namespace ``netns`` (``None``: the harness's own).

    ``rows`` holds one dict per connection and sample with the keys of
    :data:`SOCKET_COLUMNS` (``local_port`` is the server's port, ``client_*`` the peer's);
    listening and TIME_WAIT sockets are left out. ``last_error`` says why a sample failed.
    """

    def __init__(
        self, ports: int | set[int], *, interval_s: float = 0.1, netns: str | None = None
    ) -> None:
        super().__init__(interval_s, "zw-sockets")
        self.ports = {ports} if isinstance(ports, int) else set(ports)
        self.netns = netns
        self.rows: list[dict[str, Any]] = []
        self.last_error: str | None = None
        self._diag: TcpDiag | None = None

    def sample(self) -> None:
        t = time.monotonic()
        try:
            if self._diag is None:
                self._diag = TcpDiag(netns=self.netns)
            conns = self._diag.connections(self.ports)
        except Exception as exc:  # a failed sample is a gap, not the end of the run
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._close()
            return
        for c in conns:
            row = c.row()
            row["client_addr"] = row.pop("remote_addr")
            row["client_port"] = row.pop("remote_port")
            del row["local_addr"]
            self.rows.append({"t": t, **row})

    def _close(self) -> None:
        if self._diag is not None:
            self._diag.close()
            self._diag = None

    def stop(self) -> None:
        super().stop()
        self._close()
