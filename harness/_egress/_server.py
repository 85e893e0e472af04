"""Running the egress buffer: blocking in the foreground, or in a background thread.

Both bind their listening sockets before serving (so a port 0 is resolved at once and a busy
port fails early with ``OSError``) and run one asyncio event loop (``_proxy.EgressCore``).
SIGTERM, SIGINT (``serve``) and ``EgressProxy.stop`` shut down gracefully: no new
connections, idle ones closed, streams in progress given ``shutdown_timeout_s``.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
from collections.abc import Callable
from types import TracebackType

from prometheus_client import CollectorRegistry

from harness._egress._config import EgressConfig, EventLoop
from harness._egress._proxy import EgressCore
from zwcore import ProxyError

logger = logging.getLogger("zerowindow.egress")


def loop_factory(choice: EventLoop) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop factory for ``EgressConfig.event_loop`` (None: asyncio's default).

    Raises ``ProxyError`` for ``uvloop`` when uvloop is not installed."""
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ProxyError("event_loop = uvloop, but uvloop is not installed") from None
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def loop_name(choice: EventLoop) -> str:
    """``"uvloop"`` or ``"asyncio"``: the loop ``choice`` runs on here."""
    return "asyncio" if loop_factory(choice) is None else "uvloop"


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class EgressProxy:
    """An egress buffer proxy served by an asyncio loop in a daemon thread.

    Use as a context manager (``with EgressProxy(cfg) as proxy: proxy.url``) or call
    ``start``/``stop``. ``port`` and ``metrics_port`` are known as soon as the object exists
    (the sockets are bound in ``__init__``; ``EgressConfig`` ports 0 let the OS choose).
    ``registry`` is the proxy's private prometheus_client registry (the same numbers as its
    metrics listener). Raises ``OSError`` if binding fails and ``RuntimeError`` if the loop
    does not start within ``start_timeout_s`` seconds.
    """

    def __init__(self, config: EgressConfig, *, start_timeout_s: float = 10.0) -> None:
        self.config = config
        self._core = EgressCore(config)
        self._sock = _bind(config.listen_host, config.listen_port)
        self._metrics_sock: socket.socket | None = None
        try:
            if config.metrics_port is not None:
                self._metrics_sock = _bind(config.metrics_host, config.metrics_port)
        except OSError:
            self._sock.close()
            raise
        self.host = config.listen_host
        self.port: int = self._sock.getsockname()[1]
        self.metrics_port: int | None = (
            self._metrics_sock.getsockname()[1] if self._metrics_sock is not None else None
        )
        self._start_timeout_s = start_timeout_s
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL of the proxied listener, e.g. ``http://127.0.0.1:43123``."""
        return _url(self.host, self.port)

    @property
    def metrics_url(self) -> str | None:
        """URL of the metrics endpoint (``.../metrics``), or None without a metrics listener."""
        if self.metrics_port is None:
            return None
        return _url(self.config.metrics_host, self.metrics_port) + "/metrics"

    @property
    def registry(self) -> CollectorRegistry:
        """The proxy's private Prometheus registry."""
        return self._core.metrics.registry

    def start(self) -> EgressProxy:
        """Start serving; returns once both listeners accept connections."""

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            await self._core.run(
                self._sock, self._metrics_sock, stop=self._stop, on_started=self._started.set
            )

        def run() -> None:
            try:
                with asyncio.Runner(loop_factory=loop_factory(self.config.event_loop)) as runner:
                    runner.run(main())
            except BaseException as exc:  # reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"egress-{self.port}", daemon=True)
        self._thread.start()
        if not self._started.wait(self._start_timeout_s):
            raise RuntimeError("egress proxy did not start in time") from self._error
        return self

    def stop(self, timeout_s: float | None = None) -> None:
        """Shut down gracefully (see ``EgressConfig.shutdown_timeout_s``) and join the thread
        for at most ``timeout_s`` seconds (default: the shutdown timeout plus 5 s)."""
        if timeout_s is None:
            timeout_s = self.config.shutdown_timeout_s + 5.0
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # loop already closed
                pass
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._sock.close()
        if self._metrics_sock is not None:
            self._metrics_sock.close()

    def __enter__(self) -> EgressProxy:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def serve(config: EgressConfig) -> None:
    """Serve the egress buffer in the foreground until SIGTERM or SIGINT (blocking).

    Logs the listening addresses (``zerowindow.egress`` logger, level INFO). Returns after a
    graceful shutdown. Raises ``OSError`` if a port cannot be bound. Must run in the main
    thread (signal handlers).
    """
    core = EgressCore(config)
    sock = _bind(config.listen_host, config.listen_port)
    metrics_sock = None
    if config.metrics_port is not None:
        metrics_sock = _bind(config.metrics_host, config.metrics_port)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        def started() -> None:
            where = _url(config.listen_host, sock.getsockname()[1])
            metrics = (
                _url(config.metrics_host, metrics_sock.getsockname()[1]) + "/metrics"
                if metrics_sock is not None
                else "none"
            )
            logger.info(
                "egress (%s): listening on %s, upstream %s, metrics %s",
                loop_name(config.event_loop),
                where,
                config.upstream_url,
                metrics,
            )

        await core.run(sock, metrics_sock, stop=stop, on_started=started)
        logger.info("egress: stopped")

    try:
        with asyncio.Runner(loop_factory=loop_factory(config.event_loop)) as runner:
            runner.run(main())
    finally:
        sock.close()
        if metrics_sock is not None:
            metrics_sock.close()
