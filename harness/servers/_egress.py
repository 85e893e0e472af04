"""The ``egress`` proxy kind: the toolkit's own decoupled egress buffer (``harness._egress``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import Field

from harness._egress import EgressConfig
from harness._model_options import model_argv
from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._health import TargetError, free_port
from harness.servers._process import ServerProcess
from harness.servers._proxy_metrics import ProxyFigure

CLIENTS_LOG = "egress-clients.jsonl"
_E = "zerowindow_egress"
EGRESS_FIGURES = (
    ProxyFigure("buffered_bytes", f"{_E}_buffered_bytes", "gauge"),
    ProxyFigure("active_streams", f"{_E}_active_streams", "gauge"),
    ProxyFigure("requests", f"{_E}_requests_total", "counter"),
    ProxyFigure("cuts", f"{_E}_cuts_total", "counter", by_label="reason"),
    ProxyFigure("upstream_aborts", f"{_E}_upstream_aborts_total", "counter"),
    ProxyFigure("stream_peak_sum", f"{_E}_stream_peak_buffered_bytes_sum", "counter"),
    ProxyFigure("stream_peak_count", f"{_E}_stream_peak_buffered_bytes_count", "counter"),
)
"""The egress buffer's own figures (``harness/_egress/_metrics.py``): bytes held for clients
(all streams; the probe's ``buffered_bytes``), streams in progress, requests forwarded, cuts
(and ``cuts_<reason>``: ``stall_timeout``, ``overflow``), upstream aborts (all reasons), and the
per-stream peak buffered bytes histogram's ``_sum`` and ``_count``."""


@PROXIES.register
class EgressProxyConfig(ProxyConfigBase):
    """The toolkit's own decoupled egress buffer (``harness._egress``): reads the upstream at
    full speed into ``buffer_bytes`` per stream (``overflow``: ``cut`` or ``pause``) and resets a
    client that acknowledges no byte for ``stall_timeout_s`` while it owes bytes, aborting the
    upstream request. ``client_sndbuf_bytes`` caps the kernel send buffer toward clients (None:
    autotuning) and ``client_notsent_lowat_bytes`` the unsent bytes the kernel takes from the
    proxy (``TCP_NOTSENT_LOWAT``; None: the system's); ``client_tcp_nodelay`` false lets the
    kernel coalesce small writes to clients (Nagle), as nginx's ``tcp_nodelay off``. Each client
    connection's delivery record goes to ``egress-clients.jsonl`` in the run folder.
    ``event_loop``: ``auto`` (uvloop when installed, else asyncio), ``asyncio`` or ``uvloop``."""

    kind: Literal["egress"] = "egress"
    buffer_bytes: int = Field(256 * 1024, ge=1024)
    overflow: Literal["cut", "pause"] = "cut"
    stall_timeout_s: float = Field(2.5, gt=0)
    client_sndbuf_bytes: int | None = Field(32 * 1024, ge=1024)
    client_notsent_lowat_bytes: int | None = Field(16 * 1024, ge=1)
    client_tcp_nodelay: bool = True
    event_loop: Literal["auto", "asyncio", "uvloop"] = "auto"
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    startup_timeout_s: float = Field(15.0, gt=0)

    def build(self) -> Proxy:
        return EgressProxy(self)

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """``egress``: pausing, not cutting, on overflow (the bench's saturation phase outruns
        even a reader that keeps up, and a cut would end the healthy streams being measured);
        its own 2.5 s stall timeout."""
        return {"egress": cls(overflow="pause", client_sndbuf_bytes=client_sndbuf_bytes)}


class EgressProxy(Proxy):
    """``python -m harness._egress`` started for the run; its log is ``egress.log``. Its
    Prometheus metrics are served at :attr:`metrics_url` (a second port on the same host)."""

    kind: ClassVar[str] = "egress"
    metric_figures: ClassVar[tuple[ProxyFigure, ...]] = EGRESS_FIGURES

    def __init__(self, config: EgressProxyConfig) -> None:
        self.config = config
        self.port = config.listen_port or free_port(config.listen_host)
        self.metrics_port = free_port(config.listen_host, besides=[self.port])
        self.metrics_url = f"http://{config.listen_host}:{self.metrics_port}/metrics"
        self.server = ServerProcess("egress buffer")
        self.argv: list[str] = []

    def start(self, run_dir: Path, upstream_url: str) -> str:
        c = self.config
        # the kind's options that are the proxy's own settings, passed on as its options
        settings = {
            k: v for k, v in c.model_dump().items()
            if k in EgressConfig.model_fields and k not in ("listen_host", "listen_port")
        }  # fmt: skip
        self.argv = [
            sys.executable, "-m", "harness._egress",
            "--upstream", upstream_url,
            "--listen", f"{c.listen_host}:{self.port}",
            "--metrics-listen", f"{c.listen_host}:{self.metrics_port}",
            *model_argv(settings),
            "--clients-log", str(run_dir / CLIENTS_LOG),
            "--log-level", "warning",
        ]  # fmt: skip
        log_path = run_dir / "egress.log"
        url = f"http://{c.listen_host}:{self.port}"
        try:
            self.server.launch(self.argv, log_path=log_path, url=url, timeout_s=c.startup_timeout_s)
        except TargetError as exc:
            raise TargetError(f"egress buffer: {exc}; see {log_path}") from None
        return url

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "argv": self.argv, "config": self.config.model_dump(mode="json")}

    def processes(self) -> list[ServerProcess]:
        return [self.server]
