"""The ``nginx`` proxy kind: Debian's nginx as a reverse proxy in front of the target.

nginx's directives and their meaning are nginx's own
(https://nginx.org/en/docs/http/ngx_http_proxy_module.html, ngx_http_core_module.html).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._configured import ConfiguredProxy
from harness.servers._configured import duration_ms as _ms


@PROXIES.register
class NginxProxyConfig(ProxyConfigBase):
    """Debian's nginx as a reverse proxy.

    ``buffering``: ``proxy_buffering`` (on: nginx reads the upstream response as fast as it
    comes into ``proxy_buffers`` of ``buffers_count`` x ``buffer_size_kb`` KiB, spilling up to
    ``max_temp_file_size_mb`` MiB to a temporary file: the decoupled egress buffer; off: it
    forwards as the client reads, the common SSE advice). ``send_timeout_s``: how long a write
    to the client may make no progress before nginx closes the connection;
    ``reset_timedout_connection`` turns that close into a RST. ``read_timeout_s``:
    ``proxy_read_timeout`` between two upstream reads. ``ignore_client_abort``: keep reading
    upstream after the client went away. ``client_header_timeout_s`` and
    ``large_header_buffer_kb`` (``large_client_header_buffers 4 <n>k``: the longest request
    line or header field nginx accepts) bound slow and oversized request heads; their defaults
    are nginx's. ``client_sndbuf_bytes`` sets the kernel send buffer of client connections
    (``listen ... sndbuf=``; None: the kernel's autotuning, which on loopback lets Send-Q grow to
    ``tcp_wmem``'s maximum, ~4 MB, before a write to a stalled reader blocks and
    ``send_timeout`` starts counting).

    ``preset`` fills the options it names unless the scenario sets them itself:
    ``sse-advice`` is the common advice for server-sent events (``proxy_buffering off``);
    ``buffered-reset`` is the decoupled buffer with a write-stall cut (buffering on,
    ``send_timeout 3s``, ``reset_timedout_connection on``). See :data:`NGINX_PRESETS`.
    """

    kind: Literal["nginx"] = "nginx"
    preset: Literal["sse-advice", "buffered-reset"] | None = None
    buffering: bool = True
    buffer_size_kb: int = Field(16, ge=1)
    buffers_count: int = Field(8, ge=2)
    max_temp_file_size_mb: int = Field(1024, ge=0)
    send_timeout_s: float = Field(60.0, gt=0)
    read_timeout_s: float = Field(600.0, gt=0)
    reset_timedout_connection: bool = False
    ignore_client_abort: bool = False
    client_header_timeout_s: float = Field(60.0, gt=0)
    large_header_buffer_kb: int = Field(8, ge=1)
    client_sndbuf_bytes: int | None = Field(None, ge=1024)
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    binary: str = "nginx"
    startup_timeout_s: float = Field(15.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("preset") in NGINX_PRESETS:
            return {**NGINX_PRESETS[data["preset"]], **data}
        return data

    def build(self) -> Proxy:
        return NginxProxy(self)

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """``nginx``: the ``buffered-reset`` preset (buffering on, ``send_timeout 3s``,
        ``reset_timedout_connection on``)."""
        return {"nginx": cls(preset="buffered-reset", client_sndbuf_bytes=client_sndbuf_bytes)}


NGINX_PRESETS: dict[str, dict[str, Any]] = {
    "sse-advice": {"buffering": False},
    "buffered-reset": {"buffering": True, "send_timeout_s": 3.0, "reset_timedout_connection": True},
}
"""Option values of each nginx ``preset``; options a scenario sets override them."""


def render_nginx_conf(config: NginxProxyConfig, *, prefix: Path, port: int, upstream: str) -> str:
    """The whole ``nginx.conf`` for ``config``: every path (pid, logs, temporary files) lies
    under ``prefix``, it listens on ``config.listen_host:port`` and proxies to ``upstream``
    (``host:port``)."""
    on = {True: "on", False: "off"}
    sndbuf = "" if config.client_sndbuf_bytes is None else f" sndbuf={config.client_sndbuf_bytes}"
    user = "user root;\n" if os.geteuid() == 0 else ""
    return f"""# Rendered by zerowindow for this run.
{user}worker_processes 1;
daemon off;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy_temp;
    fastcgi_temp_path {prefix}/fastcgi_temp;
    uwsgi_temp_path {prefix}/uwsgi_temp;
    scgi_temp_path {prefix}/scgi_temp;
    upstream target {{ server {upstream}; keepalive 64; }}
    server {{
        listen {config.listen_host}:{port}{sndbuf};
        send_timeout {_ms(config.send_timeout_s)};
        client_header_timeout {_ms(config.client_header_timeout_s)};
        large_client_header_buffers 4 {config.large_header_buffer_kb}k;
        reset_timedout_connection {on[config.reset_timedout_connection]};
        location / {{
            proxy_pass http://target;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering {on[config.buffering]};
            proxy_buffer_size {config.buffer_size_kb}k;
            proxy_buffers {config.buffers_count} {config.buffer_size_kb}k;
            proxy_busy_buffers_size {config.buffer_size_kb * 2}k;
            proxy_max_temp_file_size {config.max_temp_file_size_mb}m;
            proxy_read_timeout {_ms(config.read_timeout_s)};
            proxy_ignore_client_abort {on[config.ignore_client_abort]};
        }}
    }}
}}
"""


class NginxProxy(ConfiguredProxy):
    """nginx started for the run (``daemon off``); its configuration and logs are in
    ``<run>/nginx/``."""

    kind = "nginx"
    label = "nginx"
    binary_hint = "on Debian: apt-get install nginx"
    conf_name = "nginx.conf"

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        host = f"[{upstream_host}]" if ":" in upstream_host else upstream_host
        return render_nginx_conf(
            self.config, prefix=folder, port=self.port, upstream=f"{host}:{upstream_port}"
        )

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        return [binary, "-c", str(conf), "-p", str(folder)]

    def spill_dir(self, run_dir: Path) -> Path | None:
        """nginx's ``proxy_temp``: response bytes beyond ``proxy_buffers`` spill there."""
        return run_dir / "nginx" / "proxy_temp"
