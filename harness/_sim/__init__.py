"""Engine emulator (``sim``): an OpenAI-compatible LLM streaming server with a KV model.

A fast, light stand-in for vLLM with continuous batching, paged KV blocks, recompute
preemption and vLLM's metric names, plus a switch that vLLM does not have:
``SimConfig.kv_release="on_delivery"`` keeps a finished request's KV blocks until its
response has left the server socket, coupling KV to slow readers as the incident write-up
claims real servers do. It is the positive control for every KV verdict (DESIGN.md).

With ``on_delivery``, a finished but undelivered request holds its KV blocks but is counted
neither in ``vllm:num_requests_running`` nor in ``vllm:num_requests_waiting``;
``sim:num_requests_held_for_delivery`` and ``sim:kv_blocks_held_for_delivery`` count them.

Public API:

- ``SimConfig``: all settings (frozen pydantic model).
- ``create_app(config)``: the Starlette ASGI app (serve it with uvicorn).
- ``serve(config, *, host, port)``: serve in the foreground until SIGINT/SIGTERM.
- ``SimServer(config, *, host, port=0)``: serve in a background thread (tests, embedding).

Command line: ``python -m harness._sim --port 8000 [--kv-release on_delivery] ...``
(``--help`` lists every ``SimConfig`` field).
"""

from harness._sim._app import create_app
from harness._sim._config import SimConfig
from harness._sim._server import SimServer, serve

__all__ = ["SimConfig", "SimServer", "create_app", "serve"]
