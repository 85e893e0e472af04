"""What a proxy costs and holds while a run goes through it: memory and buffered bytes.

:class:`ProxyProbe` samples, every ``interval_s``:

- ``rss_bytes``: resident memory of the proxy's process tree (the process the run started and
  all its descendants: nginx's master and workers), from ``/proc`` via psutil;
- ``buffered_bytes``: response bytes the proxy holds in user space: for ``egress`` its
  ``zerowindow_egress_buffered_bytes`` gauge (all streams); for ``nginx`` the size of the
  temporary files under ``<run>/nginx/proxy_temp`` (what spilled beyond ``proxy_buffers``; the
  in-memory buffers themselves are not observable from outside). nginx unlinks such a file as
  soon as it has opened it (``ngx_open_tempfile()`` in src/os/unix/ngx_files.c, for files that
  are not kept), so they are found through the open descriptors of the proxy's processes
  (``/proc/<pid>/fd``), as well as by walking the folder;
- per connection, in the kernel: ``client_send_q_bytes`` (Send-Q of the proxy's sockets that
  face the clients: bytes written but not yet acknowledged by a client) and
  ``upstream_recv_q_bytes`` (Recv-Q of the proxy's sockets that face the target: bytes the
  target sent that the proxy has not read yet), from the proxy's ``/proc/<pid>/net/tcp``
  (its own network namespace, which is the server's in a run with shaped links).

:func:`proxy_summary` turns the samples into a :class:`ProxySummary`. For ``egress`` it adds the
mean of the per-stream peak buffered bytes (the rise of the
``zerowindow_egress_stream_peak_buffered_bytes`` histogram's ``_sum`` over its ``_count``), and
its cuts and upstream aborts.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

from harness.collectors._collectors import Sampler
from netem import tcp_sockets
from zwcore import http_client

_EGRESS = "zerowindow_egress"


def tree_processes(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and all its descendants (empty if it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int | None:
    """Summed RSS (bytes) of process ``pid`` and all its descendants, ``None`` if it is gone."""
    procs = tree_processes(pid)
    return procs_rss_bytes(procs) if procs else None


def procs_rss_bytes(procs: list[psutil.Process]) -> int:
    """Summed RSS (bytes) of ``procs``; a process that is gone counts 0."""
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


def dir_bytes(path: Path, pids: list[int] | None = None) -> int:
    """Total size (bytes) of the regular files under ``path`` (0 if it does not exist),
    including those that processes ``pids`` hold open there after unlinking them; each file
    counted once."""
    sizes: dict[tuple[int, int], int] = {}
    prefix = str(path.resolve()) + os.sep

    def add(name: str) -> None:
        try:
            st = os.stat(name)
        except OSError:
            return
        sizes[(st.st_dev, st.st_ino)] = st.st_size

    for root, _, files in os.walk(path):
        for f in files:
            add(os.path.join(root, f))
    for pid in pids or []:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if link.startswith(prefix):
                add(f"{fd_dir}/{fd}")
    return sum(sizes.values())


def parse_egress_metrics(text: str) -> dict[str, float]:
    """The egress buffer's figures from its exposition text: ``buffered_bytes``, ``cuts`` and
    ``upstream_aborts`` (summed over reasons), ``cuts_<reason>`` (``stall_timeout``,
    ``overflow``), ``stream_peak_sum``/``stream_peak_count`` (the
    per-stream peak buffered bytes histogram). Raises ``ValueError`` on unparsable text."""
    out: dict[str, float] = {}
    names = {
        f"{_EGRESS}_buffered_bytes": "buffered_bytes",
        f"{_EGRESS}_cuts_total": "cuts",
        f"{_EGRESS}_upstream_aborts_total": "upstream_aborts",
        f"{_EGRESS}_stream_peak_buffered_bytes_sum": "stream_peak_sum",
        f"{_EGRESS}_stream_peak_buffered_bytes_count": "stream_peak_count",
    }
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = names.get(sample.name)
            if key is not None:
                out[key] = out.get(key, 0.0) + float(sample.value)
            if key == "cuts" and "reason" in sample.labels:
                name = f"cuts_{sample.labels['reason']}"
                out[name] = out.get(name, 0.0) + float(sample.value)
    return out


class ProxyProbe(Sampler):
    """Samples a running proxy every ``interval_s`` (see the module docstring).

    ``pid``: the proxy's process (``None``: no process, only sockets are sampled);
    ``client_port``: the port clients connect to; ``target_port``: the target's port;
    ``metrics_url``: the egress buffer's metrics; ``temp_dir``: nginx's ``proxy_temp``.
    ``rows`` holds one dict per sample: ``t`` (monotonic s), ``rss_bytes``, ``buffered_bytes``,
    ``client_send_q_bytes``, ``upstream_recv_q_bytes`` (per-connection maxima) and the egress
    counters of :func:`parse_egress_metrics`.
    """

    def __init__(
        self,
        *,
        pid: int | None,
        client_port: int,
        target_port: int,
        metrics_url: str | None = None,
        temp_dir: Path | None = None,
        interval_s: float = 0.25,
    ) -> None:
        super().__init__(interval_s, "zw-proxy-probe")
        self.pid = pid
        self.client_port = client_port
        self.target_port = target_port
        self.metrics_url = metrics_url
        self.temp_dir = temp_dir
        self.rows: list[dict[str, Any]] = []
        self._client = http_client(timeout=max(1.0, interval_s * 4))

    def sample(self) -> None:
        row: dict[str, Any] = {"t": time.monotonic()}
        procs = tree_processes(self.pid) if self.pid is not None else []
        if self.pid is not None:
            row["rss_bytes"] = procs_rss_bytes(procs) if procs else None
        send_q, recv_q = 0, 0
        # The proxy's own namespace; this process's while the proxy has not started or is gone.
        proc = f"/proc/{self.pid}" if procs else "/proc"
        for s in tcp_sockets(proc=proc):
            if s.state == "LISTEN":
                continue
            if s.local_port == self.client_port:
                send_q = max(send_q, s.send_q_bytes)
            elif s.remote_port == self.target_port and s.local_port != self.target_port:
                recv_q = max(recv_q, s.recv_q_bytes)
        row["client_send_q_bytes"] = send_q
        row["upstream_recv_q_bytes"] = recv_q
        if self.temp_dir is not None:
            row["buffered_bytes"] = dir_bytes(self.temp_dir, [p.pid for p in procs])
        if self.metrics_url is not None:
            try:
                response = self._client.get(self.metrics_url)
                response.raise_for_status()
                row.update(parse_egress_metrics(response.text))
            except (httpx.HTTPError, ValueError):
                pass
        self.rows.append(row)

    def stop(self) -> None:
        """Stop sampling (takes one last sample first). Safe to call more than once."""
        if self.is_alive():
            super().stop()
            self.sample()
        self._client.close()
