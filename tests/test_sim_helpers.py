"""Helpers shared by the emulator's tests (this module holds no tests).

Real sockets on loopback: ``stalled_client`` is a raw TCP client with a 4 KiB receive buffer
that sends one streaming request and never reads, the aggressor of DESIGN.md.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import httpx
from prometheus_client.parser import text_string_to_metric_families

from harness._sim import SimConfig

CLIENT = httpx.Client(timeout=30, limits=httpx.Limits(max_connections=64))
"""One shared client: a new ``httpx.Client`` per call costs tens of ms (SSL context)."""


def scrape(base_url: str) -> dict[str, float]:
    """Every unlabelled-by-reason sample of ``/metrics`` by name, plus
    ``request_success_total:<reason>`` keys; parsed with prometheus_client's parser."""
    text = CLIENT.get(base_url + "/metrics").text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            reason = sample.labels.get("finished_reason")
            key = sample.name if reason is None else f"{sample.name}:{reason}"
            if "le" in sample.labels:
                continue
            out[key] = sample.value
    return out


def wait_for(
    predicate: Callable[[], bool], *, timeout_s: float, interval_s: float = 0.05, what: str = ""
) -> None:
    """Poll ``predicate`` until true; AssertionError after ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def stalled_client(
    port: int, *, max_tokens: int, rcvbuf: int = 4096, prompt: str = "stall"
) -> socket.socket:
    """Open a connection with SO_RCVBUF set before connect, send one streaming completion
    request (``ignore_eos``) and return the socket without reading anything."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    body = json.dumps(
        {"model": "sim", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
         "stream": True}
    ).encode()  # fmt: skip
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body) + body
    )
    return sock


def sse_events(raw: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    events = []
    for block in raw.split("\n\n"):
        if block.strip():
            assert block.startswith("data: "), block
            events.append(block[len("data: ") :])
    return events


def fast_sim_config(kv_release: str, **kw: object) -> SimConfig:
    """An emulator whose steps take almost no time (256 blocks, 0.2 ms per step), with
    ``kw`` over those settings."""
    base: dict[str, object] = dict(
        kv_release=kv_release,
        num_blocks=256,
        step_fixed_ms=0.2,
        decode_ms_per_seq=0.01,
        prefill_ms_per_token=0.001,
    )
    base.update(kw)
    return SimConfig(**base)  # type: ignore[arg-type]


def generation_over(url: str, tokens: float) -> bool:
    """Whether the emulator at ``url`` has generated ``tokens`` and has nothing running or
    waiting (from its ``/metrics``)."""
    m = scrape(url)
    return (
        m["vllm:generation_tokens_total"] >= tokens
        and m["vllm:num_requests_running"] == 0
        and m["vllm:num_requests_waiting"] == 0
    )
