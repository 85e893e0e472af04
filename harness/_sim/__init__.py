"""Engine emulator (``sim``): an OpenAI-compatible LLM streaming server with a KV model.

A fast, light stand-in for vLLM with continuous batching, paged KV blocks, recompute
preemption and vLLM's metric names, plus a switch that vLLM does not have:
``SimConfig.kv_release="on_delivery"`` keeps a finished request's KV blocks until its
response has left the server socket, coupling KV to slow readers as the incident write-up
claims real servers do. It is the positive control for every KV verdict (DESIGN.md).

Like vLLM v1, it keeps a prefix cache (``SimConfig.enable_prefix_caching``, on by default):
freed full blocks stay findable by their tokens' hash, free but reusable, until an allocation
evicts them; KV usage counts blocks in use only.

With ``on_delivery``, a finished but undelivered request holds its KV blocks but is counted
neither in ``vllm:num_requests_running`` nor in ``vllm:num_requests_waiting``;
``sim:num_requests_held_for_delivery`` and ``sim:kv_blocks_held_for_delivery`` count them.

Like vLLM with the engine probe, it writes the engine's own tables (``engine_steps.parquet``,
``engine_requests.parquet``, ``engine_probe.json``; ``docs/run-folder.md``) into a folder when
given one: ``engine_dir`` of ``create_app``/``serve``/``SimServer``, or ``--engine-dir`` /
``$ZEROWINDOW_ENGINE_DIR`` on the command line. Ids are vLLM's: a stream's ``id`` is
``cmpl-<X-Request-Id or 16 hex>`` (``chatcmpl-...``), the engine's ``<id>-0-<8 hex>``
(chat: ``<id>-<8 hex>``).

Public API:

- ``SimConfig``: all settings (frozen pydantic model).
- ``create_app(config)``: the Starlette ASGI app (serve it with uvicorn).
- ``serve(config, *, host, port, engine_dir=None)``: serve in the foreground until
  SIGINT/SIGTERM.
- ``SimServer(config, *, host, port=0, engine_dir=None)``: serve in a background thread
  (tests, embedding).

Command line: ``python -m harness._sim --port 8000 [--kv-release on_delivery]
[--engine-dir DIR] ...``
(``--help`` lists every ``SimConfig`` field).
"""

from harness._sim._app import create_app
from harness._sim._config import SimConfig
from harness._sim._server import SimServer, serve

__all__ = ["SimConfig", "SimServer", "create_app", "serve"]
