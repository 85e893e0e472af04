"""What the llama-cpp-python probe wrapper costs: tokens/s of llama-cpp-python's OpenAI server
streaming to a full-speed reader, started plainly (``python -m llama_cpp.server``, the anchor)
and through the wrapper (``python -m harness._engine_probe._llamacpp_python``, recording into
a temporary folder), trials alternating, measured in the same run.

Usage: ``python bench/_llamacpp_probe_bench.py [--trials 3] [--requests 3] [--max-tokens 500]``
(prints one JSON object). Needs llama-cpp-python[server] and models/tiny/tiny.gguf
(``make engines``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from harness._engine_probe import ENGINE_DIR_ENV
from harness.servers import free_port

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "models" / "tiny" / "tiny.gguf"


@dataclass
class Trial:
    probe: bool
    tokens: int
    stream_s: float  # first byte of the first request to the last byte of the last (s)
    tokens_per_s: float


def _serve(probe: bool, port: int, engine_dir: str) -> subprocess.Popen[bytes]:
    module = "harness._engine_probe._llamacpp_python" if probe else "llama_cpp.server"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if probe:
        env[ENGINE_DIR_ENV] = engine_dir
    argv = [sys.executable, "-m", module, "--model", str(MODEL), "--model_alias", "tiny",
            "--port", str(port), "--n_ctx", "4096", "--interrupt_requests", "False"]  # fmt: skip
    return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(client: httpx.Client, base: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if client.get(f"{base}/v1/models").status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{base} did not answer within 60 s")


def _stream(client: httpx.Client, base: str, max_tokens: int) -> tuple[int, float, float]:
    body = {"model": "tiny", "prompt": "The city", "max_tokens": max_tokens, "stream": True}
    tokens, first, last = 0, 0.0, 0.0
    with client.stream("POST", f"{base}/v1/completions", json=body) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                now = time.monotonic()
                first = first or now
                last = now
                tokens += 1
    return tokens, first, last


def trial(probe: bool, *, requests: int, max_tokens: int) -> Trial:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as engine_dir, httpx.Client(timeout=120) as client:
        proc = _serve(probe, port, engine_dir)
        try:
            _wait(client, base)
            _stream(client, base, 32)  # warm-up
            tokens, start, end = 0, 0.0, 0.0
            for _ in range(requests):
                n, first, last = _stream(client, base, max_tokens)
                tokens, start, end = tokens + n, start or first, last
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return Trial(probe, tokens, end - start, tokens / (end - start))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=500)
    args = parser.parse_args()
    trials = [
        trial(probe, requests=args.requests, max_tokens=args.max_tokens)
        for _ in range(args.trials)
        for probe in (False, True)
    ]
    print(json.dumps({"args": vars(args), "trials": [asdict(t) for t in trials]}))


if __name__ == "__main__":
    main()
