"""What a proxy costs and holds while a run goes through it: memory and buffered bytes, per hop.

:class:`ProxyProbe` samples one hop of the proxy (a single proxy is hop 0; a chain's hops are
numbered from the clients' side inward; the run starts one probe per hop, each alike) every
``interval_s``:

- ``rss_bytes``: resident memory of the hop's process tree (the process the run started and
  all its descendants: nginx's master and workers), from ``/proc`` via psutil;
- ``buffered_bytes``: response bytes the hop holds in user space, where observable: a gauge of
  its own metrics named so (``egress``: ``zerowindow_egress_buffered_bytes``, all streams), or
  the size of the files in its spill folder (``nginx``: ``<run>/nginx/proxy_temp``, what
  spilled beyond ``proxy_buffers``; the in-memory buffers themselves are not observable from
  outside). nginx unlinks such a file as soon as it has opened it (``ngx_open_tempfile()`` in
  src/os/unix/ngx_files.c, for files that are not kept), so they are found through the open
  descriptors of the hop's processes (``/proc/<pid>/fd``), as well as by walking the folder;
- per connection, in the kernel: ``client_send_q_bytes`` (Send-Q of its sockets on its
  listening port: bytes written toward the hop in front of it, or a client, not yet
  acknowledged) and ``upstream_recv_q_bytes`` (Recv-Q of its sockets toward its upstream's port,
  the next hop's or the target's: bytes sent to it that it has not read yet), from the hop's
  ``/proc/<pid>/net/tcp`` (its network namespace, which is the server's in a run with shaped
  links). Its sockets are those its process tree holds (:func:`socket_inodes`), so another
  process's connection to the same port (the run's scrapes of the target or of a gateway's
  metrics) is not counted; a hop the run did not start has no tree, and then every socket of
  the namespace on those ports counts. A gateway that serves its metrics on its listening port
  (LiteLLM) counts the probe's scrape connection among its clients';
- its own metrics, read by its kind's declaration (``harness.servers.ProxyFigure``), and
  ``metrics_ok``, whether they answered.

``harness.analysis`` summarizes the rows per hop (``summary.json`` ``proxy``, ``proxy.hops``).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import httpx
import psutil

from harness.collectors._collectors import Sampler
from netem import TcpSocket, tcp_sockets
from zwcore import http_client


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


def fd_links(pids: list[int]) -> Iterator[tuple[str, str]]:
    """``(/proc/<pid>/fd/<fd>, what it links to)`` for every open descriptor of processes
    ``pids``; a process or descriptor that is gone is skipped."""
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                yield f"{fd_dir}/{fd}", os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue


def socket_inodes(pids: list[int]) -> set[int]:
    """The inodes of the sockets processes ``pids`` hold (descriptors linking to
    ``socket:[<inode>]``)."""
    return {int(link[8:-1]) for _, link in fd_links(pids) if link.startswith("socket:[")}


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
    for fd_path, link in fd_links(pids or []):
        if link.startswith(prefix):
            add(fd_path)
    return sum(sizes.values())


class ProbedHop(Protocol):
    """What :class:`ProxyProbe` needs of one hop (``harness.servers.ProxyHop`` is one): its
    place (``index``, 0 faces the clients), process, ports, metrics and spill folder, and how its
    metrics read."""

    @property
    def index(self) -> int: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def listen_port(self) -> int: ...
    @property
    def upstream_port(self) -> int: ...
    @property
    def metrics_url(self) -> str | None: ...
    @property
    def spill_dir(self) -> Path | None: ...

    def read_metrics(self, text: str) -> dict[str, float]:
        """The hop's figures from its metrics answer; ``ValueError`` for text that is not an
        exposition."""
        ...


class SocketTables:
    """The TCP socket tables (``/proc/<pid>/net/tcp`` and ``tcp6``) of the network namespaces the
    hops run in, read at most once per ``max_age_s`` per namespace and shared by the probes of a
    run's hops: every read walks the kernel's whole connection hash table (about 5 ms per file
    on a 2-CPU machine with 262,144 buckets, however few the sockets), what each hop needs of
    it is its own few sockets. Safe to use from several threads."""

    def __init__(self, *, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._read: dict[int, tuple[float, list[TcpSocket]]] = {}  # namespace inode -> (t, table)

    def sockets(self, proc: str) -> list[TcpSocket]:
        """The sockets of the namespace of ``proc`` (``/proc/<pid>`` or ``/proc/self``), read
        again when the last read is older than ``max_age_s``."""
        try:
            namespace = os.stat(f"{proc}/ns/net").st_ino
        except OSError:  # the process is gone: its table with it
            return []
        with self._lock:
            t, table = self._read.get(namespace, (-math.inf, []))
            if time.monotonic() - t > self.max_age_s:
                t, table = time.monotonic(), tcp_sockets(proc=proc)
                self._read[namespace] = (t, table)
        return table


class ProxyProbe(Sampler):
    """Samples one hop of a running proxy every ``interval_s`` (see the module docstring); the
    run starts one per hop, so that a hop slow to answer its metrics delays no other's samples,
    all sharing ``tables`` (default: one of their own).

    ``rows`` holds one dict per sample: ``t`` (monotonic s), ``hop`` (its index), ``rss_bytes``
    (``None``: its process is gone; absent: it has none), ``client_send_q_bytes`` and
    ``upstream_recv_q_bytes`` (per-connection maxima), ``buffered_bytes`` (where observable),
    and for a hop with metrics ``metrics_ok`` (whether they answered within
    ``max(1 s, 4 * interval_s)``) and its figures (``ProbedHop.read_metrics``).
    """

    def __init__(
        self, hop: ProbedHop, *, interval_s: float = 0.25, tables: SocketTables | None = None
    ) -> None:
        super().__init__(interval_s, f"zw-proxy-probe-{hop.index}")
        self.hop = hop
        self.tables = tables or SocketTables(max_age_s=interval_s / 2)
        self.rows: list[dict[str, Any]] = []
        self._client = http_client(timeout=max(1.0, interval_s * 4))

    def sample(self) -> None:
        hop = self.hop
        row: dict[str, Any] = {"t": time.monotonic(), "hop": hop.index}
        procs = tree_processes(hop.pid) if hop.pid is not None else []
        if hop.pid is not None:
            row["rss_bytes"] = procs_rss_bytes(procs) if procs else None
        send_q, recv_q = 0, 0
        # The hop's own namespace and sockets; with no process, any socket of this namespace.
        proc = f"/proc/{hop.pid}" if procs else "/proc/self"
        own = socket_inodes([p.pid for p in procs]) if procs else None
        for s in self.tables.sockets(proc):
            if s.state == "LISTEN" or (own is not None and s.inode not in own):
                continue
            if s.local_port == hop.listen_port:
                send_q = max(send_q, s.send_q_bytes)
            elif s.remote_port == hop.upstream_port and s.local_port != hop.upstream_port:
                recv_q = max(recv_q, s.recv_q_bytes)
        row["client_send_q_bytes"] = send_q
        row["upstream_recv_q_bytes"] = recv_q
        if hop.spill_dir is not None:
            row["buffered_bytes"] = dir_bytes(hop.spill_dir, [p.pid for p in procs])
        if hop.metrics_url is not None:
            try:
                response = self._client.get(hop.metrics_url)
                response.raise_for_status()
                row.update(hop.read_metrics(response.text), metrics_ok=True)
            except (httpx.HTTPError, ValueError):
                row["metrics_ok"] = False
        self.rows.append(row)

    def stop(self) -> None:
        """Stop sampling (takes one last sample first). Safe to call more than once."""
        if self.is_alive():
            super().stop()
            self.sample()
        self._client.close()
