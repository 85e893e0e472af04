"""What the network does: shaped links (profiles, backends, measurement), sockets, the wire."""

from netem._measure import LinkMeasurement, measure_link
from netem._nsexec import NetnsError
from netem._probe import KernelFeatures, ProbeError, probe_kernel
from netem._profiles import (
    PRESETS,
    DirectionProfile,
    LinkProfile,
    UnknownPreset,
    preset,
    resolve_profile,
)
from netem._resources import clean_all, leftovers, remove_resource
from netem._shaping import (
    BACKENDS,
    AppliedShaping,
    ShapingError,
    ShapingUnsupported,
    apply_profile,
    select_backend,
)
from netem._show import ShapingState, show
from netem._sockets import TcpSocket, parse_proc_net_tcp, tcp_sockets

__all__ = [
    "BACKENDS",
    "PRESETS",
    "AppliedShaping",
    "DirectionProfile",
    "KernelFeatures",
    "LinkMeasurement",
    "LinkProfile",
    "NetnsError",
    "ProbeError",
    "ShapingError",
    "ShapingState",
    "ShapingUnsupported",
    "TcpSocket",
    "UnknownPreset",
    "apply_profile",
    "clean_all",
    "leftovers",
    "measure_link",
    "parse_proc_net_tcp",
    "preset",
    "probe_kernel",
    "remove_resource",
    "resolve_profile",
    "select_backend",
    "show",
    "tcp_sockets",
]
