"""A target kind defined outside the toolkit, in one file with one registration: ``toy-engine``,
an engine-like server whose ``/metrics`` has names of its own (``toy_*``, nothing of vLLM's).

It is the toolkit's engine emulator (``harness._sim``'s public ``create_app``) with its
``/metrics`` answered under other names and another finish-reason label: run as a program
(``python kind_toy_engine.py --port N --engine JSON``) it serves that app. The kind declares
those names (:data:`TOY_METRICS`), that its engine writes the engine tables (the emulator does,
into ``$ZEROWINDOW_ENGINE_DIR``), its version and how to start it; the run reads its KV usage,
running and waiting from its own names. ``tests/test_extending.py`` runs it through ``zerowindow
run``, a comparison, the suite and ``zerowindow analyze``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from typing import ClassVar, Literal

from pydantic import Field

from harness._sim import SimConfig
from harness.servers import TARGETS, LaunchedTarget, MetricNames, Target, TargetConfigBase

VERSION = "0.0.1"
RENAMED = {
    "vllm:kv_cache_usage_perc": "toy_kv_used_ratio",
    "vllm:num_requests_running": "toy_active_requests",
    "vllm:num_requests_waiting": "toy_queued_requests",
    "vllm:num_preemptions": "toy_evictions",
    "vllm:generation_tokens": "toy_tokens_out",
    "vllm:prompt_tokens": "toy_tokens_in",
    "vllm:request_success": "toy_finished",
    "vllm:time_to_first_token_seconds": "toy_first_token_seconds",
    "vllm:inter_token_latency_seconds": "toy_token_gap_seconds",
    "vllm:e2e_request_latency_seconds": "toy_request_seconds",
    "vllm:request_queue_time_seconds": "toy_queue_seconds",
}
"""The emulator's vLLM names and the toy engine's (a counter's ``_total`` follows either)."""
TOY_METRICS = MetricNames(
    kv_cache_usage=("toy_kv_used_ratio",),
    num_requests_running=("toy_active_requests",),
    num_requests_waiting=("toy_queued_requests",),
    num_preemptions_total=("toy_evictions_total",),
    generation_tokens_total=("toy_tokens_out_total",),
    request_success_total=("toy_finished_total",),
    finish_reason_label="why",
    ttft_seconds=("toy_first_token_seconds",),
    itl_seconds=("toy_token_gap_seconds",),
    e2e_seconds=("toy_request_seconds",),
)


@TARGETS.register
class ToyEngineConfig(TargetConfigBase):
    """Options of the ``toy-engine`` kind: where it listens and the emulator's settings."""

    metric_names: ClassVar[MetricNames | None] = TOY_METRICS
    writes_tables: ClassVar[bool] = True

    kind: Literal["toy-engine"] = "toy-engine"
    served_model_name: str = "toy"
    host: str = "127.0.0.1"
    port: int = Field(0, ge=0, le=65535)
    engine: SimConfig = SimConfig()
    startup_timeout_s: float = 30.0
    stop_grace_s: float = 5.0

    def build(self) -> Target:
        return ToyEngine(self)


class ToyEngine(LaunchedTarget):
    """This file run as a program, its log ``toy-engine.log`` in the run folder."""

    kind: ClassVar[str] = "toy-engine"
    label: ClassVar[str] = "toy engine"
    log_name: ClassVar[str] = "toy-engine.log"
    config: ToyEngineConfig

    def versions(self) -> dict[str, str | None]:
        return {"toy-engine": VERSION}

    def build_argv(self) -> list[str]:
        engine = self.config.engine.model_copy(
            update={"served_model_name": self.config.served_model_name}
        )
        return [
            sys.executable, os.path.abspath(__file__), "--host", self.config.host,
            "--port", str(self.port), "--engine", engine.model_dump_json(),
        ]  # fmt: skip


def renamed(text: str) -> str:
    """The emulator's exposition ``text`` under the toy engine's names and label."""
    pattern = re.compile("|".join(re.escape(name) for name in sorted(RENAMED, key=len)[::-1]))
    text = pattern.sub(lambda m: RENAMED[m.group(0)], text)
    return text.replace('finished_reason="', 'why="')


def main() -> None:
    import uvicorn
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from harness._sim import create_app

    parser = argparse.ArgumentParser(prog="toy-engine")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--engine", default="{}", help="the emulator's settings (JSON)")
    args = parser.parse_args()
    config = SimConfig(**json.loads(args.engine))
    # the harness names the folder for the engine tables in ZEROWINDOW_ENGINE_DIR
    app = create_app(config, engine_dir=os.environ.get("ZEROWINDOW_ENGINE_DIR") or None)

    async def metrics(request: Request) -> Response:
        body = renamed(app.engine.metrics.render().decode())
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    app.router.routes.insert(0, Route("/metrics", metrics, methods=["GET"]))
    uvicorn.run(
        app, host=args.host, port=args.port, log_level="warning", lifespan="on",
        timeout_keep_alive=5, timeout_graceful_shutdown=2,
    )  # fmt: skip


if __name__ == "__main__":
    main()
