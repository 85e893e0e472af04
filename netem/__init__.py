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

# TEMP (replaced by the netem-split branch's façade)
from netem._clean import clean  # noqa: E402
from netem._delayline import DelayLine  # noqa: E402
from netem._diag import TcpDiag, tcp_connections  # noqa: E402
from netem._links import check_profiles  # noqa: E402
from netem._manual import apply_and_hold, clear_shaping, overview  # noqa: E402
from netem._netns import NetemError, NetemPermissionError, exec_prefix, has_net_admin, process_start_ticks  # noqa: E402
from netem._nsexec import socket_in  # noqa: E402
from netem._resources import delay_line_processes  # noqa: E402
from netem._shaping import NetemBackend, shaping_tag  # noqa: E402
from netem._state import NetemState, read_state  # noqa: E402
from netem._topology import Topology  # noqa: E402
from netem._wire import CaptureError, WireCapture, stalled_flows, wire_events, write_wire_parquet  # noqa: E402
