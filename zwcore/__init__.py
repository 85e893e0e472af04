"""The toolkit's foundation, shared by ``loadgen``, ``netem`` and ``harness``: the registry by
``kind`` that every pluggable part uses, plugins that register kinds, the one exception tree,
CPU lists, HTTP clients, and the reaper that ends what the harness started once the harness is
gone."""

from zwcore._cpus import format_cpu_list, parse_cpu_list
from zwcore._errors import (
    HistoryError,
    LoadError,
    NetworkError,
    ProxyError,
    RunFolderError,
    ScenarioError,
    TargetError,
    ZerowindowError,
)
from zwcore._http import http_client
from zwcore._plugins import is_file_plugin, load_plugins, resolve_plugins
from zwcore._reaper import reap_on_exit
from zwcore._registry import Registry, UnknownKindError, kind_of, relocated_errors

__all__ = [
    "LoadError",
    "NetworkError",
    "ProxyError",
    "Registry",
    "HistoryError",
    "RunFolderError",
    "ScenarioError",
    "TargetError",
    "UnknownKindError",
    "ZerowindowError",
    "format_cpu_list",
    "http_client",
    "is_file_plugin",
    "kind_of",
    "load_plugins",
    "parse_cpu_list",
    "reap_on_exit",
    "relocated_errors",
    "resolve_plugins",
]
