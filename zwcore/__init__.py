"""The toolkit's foundation, shared by ``loadgen``, ``netem`` and ``harness``: the registry by
``kind`` that every pluggable part uses, and the one exception tree."""

from zwcore._errors import (
    LoadError,
    NetworkError,
    ProxyError,
    RunFolderError,
    ScenarioError,
    TargetError,
    ZerowindowError,
)
from zwcore._registry import Registry, UnknownKindError, kind_of, relocated_errors

__all__ = [
    "LoadError",
    "NetworkError",
    "ProxyError",
    "Registry",
    "RunFolderError",
    "ScenarioError",
    "TargetError",
    "UnknownKindError",
    "ZerowindowError",
    "kind_of",
    "relocated_errors",
]
