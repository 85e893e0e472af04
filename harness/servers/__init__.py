"""Servers: the target under test and the proxy in front of it, one module per ``kind``.

Targets: ``vllm`` (a real vLLM server), ``llama-cpp-python`` (its OpenAI server, with the
probe wrapper), ``llama-server`` (llama.cpp's C++ server), ``sim`` (the built-in engine
emulator), ``url`` (a server already running), ``command`` (any server from a command line).
Proxies: ``none``, ``nginx``, ``haproxy``, ``envoy``, ``traefik``, ``litellm`` (the LiteLLM
proxy as a gateway), ``egress`` (the toolkit's
decoupled egress buffer), ``command`` (any proxy or gateway from a command line), ``chain``
(several of them, one behind the other). Each kind's module holds its
options (a config model registered with :data:`TARGETS` or :data:`PROXIES`), its server class
and nothing else: a target kind declares its metric names (:class:`MetricNames`), whether it
writes the engine tables, its versions and its idle test; a proxy kind, how the proxy
benchmark configures it and the figures its own metrics serve (:class:`ProxyFigure`).
``docs/extending.md`` says how to add one.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

from harness.servers import (  # noqa: F401
    _chain,
    _command,
    _egress,
    _envoy,
    _haproxy,
    _litellm,
    _llama_server,
    _llamacpp_python,
    _nginx,
    _none,
    _sim,
    _traefik,
    _url,
    _vllm,
)
from harness.servers._base import (
    PROXIES,
    TARGETS,
    Proxy,
    ProxyConfig,
    ProxyConfigBase,
    ProxyHop,
    Server,
    StrictOptions,
    Target,
    TargetConfig,
    TargetConfigBase,
    hop_metric_names,
    known_metric_names,
    make_proxy,
    make_target,
    metric_presets,
    url_port,
)

if TYPE_CHECKING:  # loaded on first use: they import torch, gguf, the build tools
    from harness.servers._llama_build import build_llama_server
    from harness.servers._tiny_gguf import GGUF_NAME, write_gguf
    from harness.servers._tiny_model import make_tiny_model
from harness.servers._egress import EgressProxyConfig
from harness.servers._envoy import EnvoyProxyConfig
from harness.servers._haproxy import HaproxyProxyConfig
from harness.servers._health import free_port, wait_healthy
from harness.servers._launched import LaunchedTarget
from harness.servers._llama_server import LlamaServerTargetConfig
from harness.servers._llamacpp_python import LlamaCppPythonTargetConfig
from harness.servers._metric_names import (
    HISTOGRAM_FIGURES,
    SCALAR_FIGURES,
    MetricNames,
    read_figures,
)
from harness.servers._nginx import NGINX_PRESETS, NginxProxyConfig, render_nginx_conf
from harness.servers._none import NoProxyConfig
from harness.servers._process import ServerProcess, start_process, stop_process_group
from harness.servers._proxy_metrics import ProxyFigure, read_proxy_figures
from harness.servers._readiness import READINESS, Readiness
from harness.servers._sim import SimTargetConfig
from harness.servers._url import UrlTargetConfig
from harness.servers._versions import package_version
from harness.servers._vllm import VLLM_METRICS, VllmTargetConfig

__all__ = [
    "HISTOGRAM_FIGURES",
    "LaunchedTarget",
    "MetricNames",
    "SCALAR_FIGURES",
    "VLLM_METRICS",
    "hop_metric_names",
    "known_metric_names",
    "metric_presets",
    "package_version",
    "read_figures",
    "read_proxy_figures",
    "make_tiny_model",
    "write_gguf",
    "GGUF_NAME",
    "stop_process_group",
    "start_process",
    "build_llama_server",
    "NGINX_PRESETS",
    "PROXIES",
    "READINESS",
    "TARGETS",
    "EgressProxyConfig",
    "EnvoyProxyConfig",
    "HaproxyProxyConfig",
    "LlamaCppPythonTargetConfig",
    "LlamaServerTargetConfig",
    "NginxProxyConfig",
    "NoProxyConfig",
    "Proxy",
    "ProxyConfig",
    "ProxyConfigBase",
    "ProxyFigure",
    "ProxyHop",
    "Readiness",
    "Server",
    "ServerProcess",
    "SimTargetConfig",
    "StrictOptions",
    "Target",
    "TargetConfig",
    "TargetConfigBase",
    "UrlTargetConfig",
    "VllmTargetConfig",
    "free_port",
    "make_proxy",
    "make_target",
    "render_nginx_conf",
    "url_port",
    "wait_healthy",
]

_LAZY = {
    "GGUF_NAME": "harness.servers._tiny_gguf",
    "build_llama_server": "harness.servers._llama_build",
    "make_tiny_model": "harness.servers._tiny_model",
    "write_gguf": "harness.servers._tiny_gguf",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value
    return value
