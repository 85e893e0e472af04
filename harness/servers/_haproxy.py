"""The ``haproxy`` proxy kind: Debian's HAProxy in front of the target.

Directives and their meaning are HAProxy's own (configuration manual of 2.6,
https://docs.haproxy.org/2.6/configuration.html): ``timeout client`` is the inactivity
timeout on the client side, which also runs while HAProxy waits for a stalled reader to take
data; ``timeout server`` the same toward the target; ``tune.bufsize`` the size of each of the
(two per stream) buffers, which bounds what HAProxy holds per stream and the largest request
head it accepts (minus ``tune.maxrewrite``); ``option abortonclose`` drops a request whose
client went away before the server answered; ``option nolinger`` closes with a RST instead of
a FIN; ``option http-no-delay`` sends each piece of a response at once (by default HAProxy
sends with MSG_MORE and the kernel may hold small SSE events for up to ~200 ms; see
``bench/RESULTS.md``); ``timeout http-request`` bounds the time a client may take to send its
request head; ``tune.sndbuf.client`` fixes the kernel send buffer toward clients (unset:
autotuning, which on loopback lets ~4 MB queue before a write to a stalled reader blocks).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._configured import ConfiguredProxy, duration_ms


@PROXIES.register
class HaproxyProxyConfig(ProxyConfigBase):
    """HAProxy as a streaming reverse proxy (``mode http``, one thread). Times in seconds,
    sizes in bytes; see the module docstring for each directive."""

    kind: Literal["haproxy"] = "haproxy"
    timeout_client_s: float = Field(60.0, gt=0)
    timeout_server_s: float = Field(600.0, gt=0)
    timeout_connect_s: float = Field(5.0, gt=0)
    timeout_http_request_s: float = Field(10.0, gt=0)
    tune_bufsize: int = Field(16384, ge=4096, description="tune.bufsize, bytes")
    abortonclose: bool = False
    nolinger: bool = False
    http_no_delay: bool = False
    client_sndbuf_bytes: int | None = Field(None, ge=1024, description="tune.sndbuf.client")
    maxconn: int = Field(4096, ge=1)
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    binary: str = "haproxy"
    startup_timeout_s: float = Field(15.0, gt=0)

    def build(self) -> Proxy:
        return HaproxyProxy(self)

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """``haproxy``: ``timeout client 3s`` and ``option nolinger``; ``haproxy-nodelay``: also
        ``option http-no-delay`` (without it HAProxy may hold small SSE events ~200 ms)."""
        return {
            name: cls(
                timeout_client_s=3,
                nolinger=True,
                http_no_delay=no_delay,
                client_sndbuf_bytes=client_sndbuf_bytes,
            )
            for name, no_delay in (("haproxy", False), ("haproxy-nodelay", True))
        }


def render_haproxy_cfg(
    config: HaproxyProxyConfig, *, port: int, upstream_host: str, upstream_port: int
) -> str:
    """The whole ``haproxy.cfg`` for ``config``: listens on ``config.listen_host:port`` and
    forwards everything to ``upstream_host:upstream_port``; logs go to stderr."""
    c = config
    option = {True: "option", False: "no option"}
    sndbuf = (
        "" if c.client_sndbuf_bytes is None else f"    tune.sndbuf.client {c.client_sndbuf_bytes}\n"
    )
    return f"""# Rendered by zerowindow for this run.
global
    nbthread 1
    maxconn {c.maxconn}
    tune.bufsize {c.tune_bufsize}
{sndbuf}    log stderr format raw local0 info

defaults
    mode http
    log global
    option httplog
    timeout connect {duration_ms(c.timeout_connect_s)}
    timeout client {duration_ms(c.timeout_client_s)}
    timeout server {duration_ms(c.timeout_server_s)}
    timeout http-request {duration_ms(c.timeout_http_request_s)}
    {option[c.abortonclose]} abortonclose
    {option[c.nolinger]} nolinger
    {option[c.http_no_delay]} http-no-delay

frontend zerowindow
    bind {c.listen_host}:{port}
    default_backend target

backend target
    server target {upstream_host}:{upstream_port}
"""


class HaproxyProxy(ConfiguredProxy):
    """HAProxy started for the run in the foreground (``-db``); its configuration and log are
    in ``<run>/haproxy/``."""

    kind = "haproxy"
    label = "haproxy"
    binary_hint = "on Debian: apt-get install haproxy"
    conf_name = "haproxy.cfg"

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        return render_haproxy_cfg(
            self.config, port=self.port, upstream_host=upstream_host, upstream_port=upstream_port
        )

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        return [binary, "-db", "-f", str(conf)]
