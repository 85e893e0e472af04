"""Running the emulator under uvicorn: blocking in the foreground, or in a background thread.

uvicorn settings follow vLLM's server (``vllm/entrypoints/launchers/launcher.py``
``serve_http``): uvicorn's default HTTP protocol and event loop (httptools and uvloop when
installed) and a 5 s keep-alive timeout (vLLM's ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE`` default).
Shutdown (SIGTERM, SIGINT, ``SimServer.stop``) is graceful for at most
``graceful_shutdown_s``; streams still open then (stalled clients) are cancelled, which
aborts their requests and releases their KV blocks.

``engine_dir`` (both ways of serving) names the folder the engine writes its tables into
(``_recorder``); they are finished at shutdown, including a forced one (a second SIGINT).
"""

from __future__ import annotations

import gc
import os
import signal
import socket
import threading
from types import FrameType, TracebackType
from typing import Literal

import uvicorn

from harness._sim._app import SimApp, create_app
from harness._sim._config import SimConfig

KEEP_ALIVE_S = 5.0
GRACEFUL_SHUTDOWN_S = 2.0


class _Server(uvicorn.Server):
    """uvicorn's server, minus re-raising the signal after a graceful shutdown.

    uvicorn re-raises a captured SIGTERM once it has shut down, so the process dies by the
    signal; the emulator returns normally instead (exit status 0).
    """

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True


Loop = Literal["auto", "asyncio", "uvloop"]
"""uvicorn's event loop choice; ``auto`` is uvloop when installed (as ``vllm serve``)."""


def _uvicorn_config(
    app: SimApp, *, host: str, port: int, log_level: str, loop: Loop
) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=loop,
        log_level=log_level,
        lifespan="on",
        timeout_keep_alive=int(KEEP_ALIVE_S),
        timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
    )


def serve(
    config: SimConfig | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    loop: Loop = "auto",
    engine_dir: str | os.PathLike[str] | None = None,
) -> None:
    """Serve the emulator on ``host:port`` until SIGINT or SIGTERM (blocking).

    ``port`` 0 lets the OS choose (uvicorn logs the address). ``loop`` is uvicorn's event
    loop: ``auto`` (uvloop when installed, what ``vllm serve`` runs) or ``asyncio``, whose
    accept keeps up better with thousands of connections opened at once under load (with
    uvloop, pending connections were accepted at about 30/s while 1,000+ streams ran).
    Returns after a graceful shutdown. Raises ``SystemExit`` (from uvicorn) if the port
    cannot be bound. Tunes the process's garbage collector for throughput (``serve`` owns
    the process): thousands of open streams make Python's default, frequent collections
    a large share of the CPU time. ``engine_dir``: see ``create_app`` (``OSError`` if it is
    not a writable folder).
    """
    app = create_app(config, engine_dir=engine_dir)
    gc.freeze()  # objects created at import and startup are never collected
    gc.set_threshold(100_000, 50, 100)
    try:
        _Server(_uvicorn_config(app, host=host, port=port, log_level=log_level, loop=loop)).run()
    finally:
        app.engine.close_tables()  # done at lifespan shutdown, unless forced or failed


class SimServer:
    """An emulator served by uvicorn in a daemon thread, on an OS-chosen port by default.

    Use as a context manager (``with SimServer(cfg) as srv: srv.url``) or call
    ``start``/``stop``. ``port`` is known as soon as the object exists (the listening
    socket is bound in ``__init__``). ``engine_dir``: the folder for the engine tables (see
    ``create_app``), finished by ``stop``. Raises ``OSError`` if binding fails or
    ``engine_dir`` is not writable, and ``RuntimeError`` if the server does not start within
    ``start_timeout_s`` seconds.
    """

    def __init__(
        self,
        config: SimConfig | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        log_level: str = "warning",
        loop: Loop = "auto",
        start_timeout_s: float = 10.0,
        engine_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.config = config or SimConfig()
        self.app = create_app(self.config, engine_dir=engine_dir)
        self._sock = socket.create_server((host, port), backlog=2048)
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        self._server = _Server(
            _uvicorn_config(self.app, host=host, port=self.port, log_level=log_level, loop=loop)
        )
        self._thread: threading.Thread | None = None
        self._start_timeout_s = start_timeout_s
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:43123``."""
        return f"http://{self.host}:{self.port}"

    def start(self) -> SimServer:
        """Start serving; returns once uvicorn has started."""

        def run() -> None:
            try:
                self._server.run(sockets=[self._sock])
            except BaseException as exc:  # reported by start()
                self._error = exc

        self._thread = threading.Thread(target=run, name=f"sim-{self.port}", daemon=True)
        self._thread.start()
        event = threading.Event()
        deadline = self._start_timeout_s
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("sim server exited during startup") from self._error
            if deadline <= 0:
                raise RuntimeError("sim server did not start in time")
            event.wait(0.01)
            deadline -= 0.01
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        """Shut down (graceful for 2 s, then open streams are cancelled) and join; the
        engine tables are finished (unless the server thread is still running after
        ``timeout_s`` seconds)."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._sock.close()
        if self._thread is None or not self._thread.is_alive():
            self.app.engine.close_tables()

    def __enter__(self) -> SimServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
