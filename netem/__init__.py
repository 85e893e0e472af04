"""What the network does: shaped links (profiles, backends, measurement), sockets, the wire.

This is netem's public face: code outside the package imports from ``netem`` only; the
``netem._*`` modules are private. Importing it starts nothing and changes nothing on the host.
Every exception netem raises derives from :class:`NetemError`, itself a
:class:`zwcore.NetworkError`.
"""

from typing import TYPE_CHECKING, Any

from netem._clean import CleanReport, clean
from netem._diag import TcpConnInfo, TcpDiag, tcp_connections
from netem._errors import (
    CaptureError,
    NetemError,
    NetemPermissionError,
    NetnsError,
    ProbeError,
    ShapingError,
    ShapingUnsupported,
    UnknownPreset,
)
from netem._links import (
    check_profiles,
    profile_argument,
    resolve_group_profile,
    unknown_profile,
)
from netem._manual import apply_and_hold, clear_shaping, overview
from netem._measure import LinkMeasurement, measure_link
from netem._netns import (
    create_netns,
    exec_prefix,
    has_net_admin,
    list_netns,
    netns_pids,
    process_alive,
    process_start_ticks,
    run_in_netns,
)
from netem._nsexec import socket_in
from netem._probe import KernelFeatures, probe_kernel
from netem._profiles import (
    PRESETS,
    DirectionProfile,
    LinkProfile,
    preset,
    resolve_profile,
)
from netem._resources import clean_all, delay_line_processes, leftovers, remove_resource
from netem._shaping import (
    BACKENDS,
    AppliedShaping,
    Backend,
    apply_profile,
    select_backend,
    shaping_tag,
)
from netem._shaping_fallback import FallbackBackend
from netem._shaping_netem import NetemBackend
from netem._show import ShapingState, show
from netem._sockets import TcpSocket, parse_proc_net_tcp, tcp_sockets
from netem._state import NetemState, read_state
from netem._topology import GroupLink, Topology
from netem._wire import WireCapture, stalled_flows, wire_events, write_wire_parquet

if TYPE_CHECKING:
    from netem._delayline import DelayLine

__all__ = [
    "BACKENDS",
    "PRESETS",
    "AppliedShaping",
    "Backend",
    "CaptureError",
    "CleanReport",
    "DelayLine",
    "DirectionProfile",
    "FallbackBackend",
    "GroupLink",
    "KernelFeatures",
    "LinkMeasurement",
    "LinkProfile",
    "NetemBackend",
    "NetemError",
    "NetemPermissionError",
    "NetemState",
    "NetnsError",
    "ProbeError",
    "ShapingError",
    "ShapingState",
    "ShapingUnsupported",
    "TcpConnInfo",
    "TcpDiag",
    "TcpSocket",
    "Topology",
    "UnknownPreset",
    "WireCapture",
    "apply_and_hold",
    "apply_profile",
    "check_profiles",
    "profile_argument",
    "unknown_profile",
    "clean",
    "clean_all",
    "clear_shaping",
    "create_netns",
    "delay_line_processes",
    "exec_prefix",
    "has_net_admin",
    "leftovers",
    "list_netns",
    "measure_link",
    "netns_pids",
    "overview",
    "parse_proc_net_tcp",
    "preset",
    "probe_kernel",
    "process_alive",
    "process_start_ticks",
    "read_state",
    "remove_resource",
    "resolve_group_profile",
    "resolve_profile",
    "run_in_netns",
    "select_backend",
    "shaping_tag",
    "show",
    "socket_in",
    "stalled_flows",
    "tcp_connections",
    "tcp_sockets",
    "wire_events",
    "write_wire_parquet",
]


def __getattr__(name: str) -> Any:
    """``DelayLine``, imported on first use. Its module also runs as a program (``python -m
    netem._delayline``, started by the fallback backend); imported by this package's own start,
    it would make runpy print a warning ahead of the delay line's READY line."""
    if name == "DelayLine":
        from netem._delayline import DelayLine

        return DelayLine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
