"""Configuration of the decoupled egress buffer: one frozen, validated record.

Every knob of the proxy lives here, with its unit in its name. The defaults follow the
remedy described in DESIGN.md: a 256 KiB host-memory buffer per stream, a 2.5 s stall timeout
on delivery progress (bytes the client acknowledged), and a small kernel share of the backlog
on client sockets (``TCP_NOTSENT_LOWAT``, a capped send buffer) so that unsent bytes wait in
the proxy's own buffer, where they are counted and bounded, instead of the kernel's Send-Q.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

Overflow = Literal["cut", "pause"]
"""What a stream does when its buffer is full.

``cut``: reset the client (TCP RST) and close the upstream connection, so the engine aborts
the request. ``pause``: stop reading the upstream response until the client has drained
half of the buffer (the upstream then sees a slow reader: backpressure reaches the engine's
socket)."""


EventLoop = Literal["auto", "asyncio", "uvloop"]
"""The event loop the proxy runs on. ``auto``: uvloop when it is installed (what uvicorn, and
so ``vllm serve``, picks), else asyncio's own."""


class EgressConfig(BaseModel):
    """Settings of one egress buffer proxy; frozen, unknown fields are an error.

    Sizes are in bytes, times in seconds. ``upstream_url`` is ``http://host[:port]`` (port 80
    when omitted; no path, query, fragment or user info): the only server the proxy ever
    connects to. ``listen_port`` and ``metrics_port`` 0 let the OS choose;
    ``metrics_port`` None serves no metrics.

    Raises ``pydantic.ValidationError`` on invalid values (including an upstream URL that is
    not plain ``http://host[:port]``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    upstream_url: str = Field(description="the one upstream: http://host[:port]")
    listen_host: str = Field(default="127.0.0.1", description="address to accept clients on")
    listen_port: int = Field(default=8080, ge=0, le=65535, description="0: the OS chooses")
    metrics_host: str = Field(default="127.0.0.1", description="address of the metrics listener")
    metrics_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="port of the Prometheus metrics listener (GET /metrics); None: no metrics "
        "listener, 0: the OS chooses",
    )
    buffer_bytes: int = Field(
        default=256 * 1024,
        ge=1024,
        description="per-stream buffer in host memory, bytes (the connection's asyncio write "
        "buffer: response bytes the client's socket has not accepted yet)",
    )
    overflow: Overflow = Field(
        default="cut",
        description="when a stream's buffer is full: cut (reset the client, abort upstream) "
        "or pause (stop reading upstream until half of the buffer has drained)",
    )
    stall_timeout_s: float = Field(
        default=2.5,
        gt=0.0,
        description="a client that acknowledges no byte (tcpi_bytes_acked, tcp(7)) for this "
        "long while the proxy has bytes for it is reset (RST) and its upstream request "
        "aborted, seconds; a slow reader that still acknowledges is never cut",
    )
    client_notsent_lowat_bytes: int | None = Field(
        default=16 * 1024,
        ge=1,
        description="TCP_NOTSENT_LOWAT of accepted client sockets, bytes (tcp(7)): a socket "
        "is writable only while fewer unsent bytes wait in the kernel, so the backlog stays "
        "in the proxy's buffer. None keeps net.ipv4.tcp_notsent_lowat",
    )
    client_tcp_nodelay: bool = Field(
        default=True,
        description="TCP_NODELAY on accepted client sockets (tcp(7)), as nginx's tcp_nodelay: "
        "every write leaves at once. false lets the kernel hold a small write while earlier "
        "bytes are unacknowledged (Nagle, RFC 896): fewer packets and CPU per event, tokens "
        "later by up to a round trip (measured in bench/RESULTS.md)",
    )
    client_sndbuf_bytes: int | None = Field(
        default=32 * 1024,
        ge=1024,
        description="SO_SNDBUF of accepted client sockets, bytes (the kernel doubles it, "
        "socket(7)); caps the kernel Send-Q so a stall reaches the proxy's buffer quickly. "
        "None keeps the kernel's autotuning (net.ipv4.tcp_wmem)",
    )
    max_header_bytes: int = Field(
        default=32 * 1024,
        ge=1024,
        description="request line plus header fields at most, bytes; more is answered 431",
    )
    max_body_bytes: int = Field(
        default=4 * 1024 * 1024,
        ge=0,
        description="request body at most, bytes; more is answered 413",
    )
    max_connections: int = Field(
        default=1024,
        ge=1,
        description="concurrent client connections at most; one more is answered 503",
    )
    header_timeout_s: float = Field(
        default=10.0,
        gt=0.0,
        description="time from a request's first byte (or from accepting the connection) "
        "to its complete header section; a slower client gets 408 and is closed, seconds",
    )
    body_timeout_s: float = Field(
        default=30.0, gt=0.0, description="time to receive a request body, seconds"
    )
    keepalive_timeout_s: float = Field(
        default=75.0,
        gt=0.0,
        description="an idle keep-alive connection waits this long for its next request, seconds",
    )
    upstream_connect_timeout_s: float = Field(
        default=5.0, gt=0.0, description="TCP connect to the upstream at most, seconds"
    )
    event_loop: EventLoop = Field(
        default="auto",
        description="auto: uvloop when installed, else asyncio (uvloop wakes up faster for a "
        "read of one event: the proxy's added latency at low load)",
    )
    clients_log: str | None = Field(
        default=None,
        description="file to append one JSON line per client connection to when it ends: "
        "bytes written and acknowledged, acknowledged bytes over time, last progress, why "
        "and when it was cut; None: no log",
    )
    shutdown_timeout_s: float = Field(
        default=10.0,
        ge=0.0,
        description="on stop or SIGTERM, streams in progress get this long to finish before "
        "they are closed and their upstream requests aborted, seconds",
    )

    @field_validator("upstream_url")
    @classmethod
    def _plain_http(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme != "http":
            raise ValueError(f"upstream_url must start with http:// (got {value!r})")
        if not parts.hostname:
            raise ValueError(f"upstream_url has no host: {value!r}")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"upstream_url must have no path, query or fragment: {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(f"upstream_url must have no user info: {value!r}")
        try:
            parts.port  # noqa: B018 - raises ValueError on a bad port
        except ValueError as exc:
            raise ValueError(f"upstream_url has an invalid port: {value!r}") from exc
        return value

    @property
    def upstream_host(self) -> str:
        """Host name or address of the upstream (IPv6 without brackets)."""
        host = urlsplit(self.upstream_url).hostname
        assert host is not None  # validated
        return host

    @property
    def upstream_port(self) -> int:
        """TCP port of the upstream (80 when the URL names none)."""
        return urlsplit(self.upstream_url).port or 80

    @property
    def upstream_authority(self) -> str:
        """``host[:port]`` as sent in the upstream ``Host`` header (RFC 9112 section 3.2)."""
        host = self.upstream_host
        if ":" in host:
            host = f"[{host}]"
        port = self.upstream_port
        return host if port == 80 else f"{host}:{port}"
