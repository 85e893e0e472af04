"""Decoupled egress buffer (``egress``): the toolkit's own streaming reverse proxy.

The remedy of DESIGN.md, built to be measured: an asyncio reverse proxy (h11 for HTTP/1.1,
RFC 9112) in front of one OpenAI-compatible upstream. It reads each upstream response at
full speed into a bounded per-stream buffer in host memory, writes to the client as fast as
the client's socket accepts, and when a client owes bytes and acknowledges none for
``stall_timeout_s`` (``tcpi_bytes_acked``: no delivery progress) it resets the client (TCP
RST via ``SO_LINGER`` 0) and closes the upstream connection so that the engine aborts the
request. It forwards every path to its configured upstream only (the engine's ``/metrics``
included) and serves its own Prometheus metrics (``zerowindow_egress_*``) on a separate
listener.

Public API:

- ``EgressConfig``: all settings (frozen pydantic model).
- ``EgressProxy(config)``: serve in a background thread (tests, embedding); ``.url``,
  ``.port``, ``.metrics_url``; a context manager.
- ``serve(config)``: serve in the foreground until SIGTERM/SIGINT.
- ``main(argv)``: the command line, ``python -m harness._egress --upstream URL --listen
  HOST:PORT [--metrics-listen HOST:PORT] [...]`` (``--help`` lists every option).
"""

from harness._egress._cli import main
from harness._egress._config import EgressConfig
from harness._egress._server import EgressProxy, serve

__all__ = ["EgressConfig", "EgressProxy", "main", "serve"]
