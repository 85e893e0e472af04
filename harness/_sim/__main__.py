"""Command line of the engine emulator: ``python -m harness._sim --port N [options]``.

Every ``SimConfig`` field is an option (``--kv-release on_delivery``, ``--num-blocks 64``,
...); ``--host``, ``--port``, ``--loop`` and ``--log-level`` go to uvicorn. SIGTERM and SIGINT shut
down gracefully (exit status 0).

``--engine-dir DIR`` (default: the environment variable ``ZEROWINDOW_ENGINE_DIR``, which the
harness sets to the run folder) makes the engine write its tables there
(``engine_steps.parquet``, ``engine_requests.parquet``, ``engine_probe.json``), finished at
shutdown; neither given, it writes none.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from harness._engine_probe import ENGINE_DIR_ENV
from harness._model_options import add_model_options
from harness._sim._config import SimConfig
from harness._sim._server import serve


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser with one option per ``SimConfig`` field, plus host/port."""
    parser = argparse.ArgumentParser(
        prog="python -m harness._sim",
        description="zerowindow engine emulator (OpenAI-compatible, vLLM metric names)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0: let the OS choose")
    parser.add_argument(
        "--loop",
        default="auto",
        choices=["auto", "asyncio", "uvloop"],
        help="uvicorn event loop (auto: uvloop when installed, as vllm serve)",
    )
    parser.add_argument(
        "--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"]
    )
    parser.add_argument(
        "--engine-dir",
        default=None,
        help=f"folder to write the engine tables into (default: ${ENGINE_DIR_ENV}; "
        "neither set: none are written)",
    )
    add_model_options(parser, SimConfig)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, validate the config and serve until a signal; the exit status."""
    args = vars(build_parser().parse_args(argv))
    host, port, log_level = args.pop("host"), args.pop("port"), args.pop("log_level")
    loop = args.pop("loop")
    engine_dir = args.pop("engine_dir") or os.environ.get(ENGINE_DIR_ENV) or None
    if not 0 <= port <= 65535:
        print(f"python -m harness._sim: --port {port}: must be within 0..65535", file=sys.stderr)
        return 2
    if engine_dir is not None and not (
        os.path.isdir(engine_dir) and os.access(engine_dir, os.W_OK)
    ):
        print(f"python -m harness._sim: --engine-dir {engine_dir}: not a writable folder",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        config = SimConfig(**args)
    except ValidationError as exc:
        for err in exc.errors():
            field = ".".join(str(p) for p in err["loc"]) or "config"
            print(
                f"python -m harness._sim: --{field.replace('_', '-')}: {err['msg']}",
                file=sys.stderr,
            )
        return 2
    serve(config, host=host, port=port, log_level=log_level, loop=loop, engine_dir=engine_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
