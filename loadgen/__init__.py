"""What clients do: Locust users that stream from OpenAI-compatible endpoints and record timings.

Import costs: the read behaviours, configuration models, SSE decoder and the socket client load
without Locust. The Locust-bound names (``StreamingUser``, ``SlowReaderUser``, ``OpenLoopUser``,
``user_class_from_config``, ``quit_when_users_done``, ``exit_zero_on_request_failures``,
``sample_saturation``) load Locust, and with it gevent's monkey-patching, on first use only.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from zwcore import Registry, UnknownKindError

from ._actions import (
    ACTIONS,
    LEAVE_STYLES,
    AbortiveClose,
    ActionConfig,
    ClientAction,
    HalfClose,
    Leave,
    LeaveStyle,
    Stall,
    StopReading,
)
from ._arrivals import (
    ARRIVALS,
    ArrivalBase,
    ArrivalConfig,
    ConstantArrivals,
    GammaArrivals,
    PlannedRequest,
    PoissonArrivals,
    RateArrivals,
)
from ._client import stream_request
from ._clock import ClockEstimate, clock_estimates, to_harness_clock
from ._config import SATURATION_ENV, GroupRunConfig, UserGroupConfig
from ._conversations import (
    CONVERSATION_FORMATS,
    ConversationError,
    ConversationFormat,
    RecordedSession,
    RecordedTurn,
    read_conversations,
)
from ._lengths import (
    LENGTHS,
    FixedLength,
    LengthBase,
    LengthConfig,
    LognormalLength,
    NormalLength,
    UniformLength,
)
from ._openai import ENDPOINT_PATHS, Endpoint, TokenCounter, parse_payload, request_body
from ._prompt import build_prompt, prompt_seed
from ._reads import READS, FullSpeed, Paced, ReadBehaviour, ReadConfig
from ._records import OUTCOMES, Chunk, RecordWriter, RequestRecord, read_records, ttft_ms
from ._request import RequestSpec, new_traceparent, trace_ids
from ._session_config import (
    THINK_TIMES,
    TURN_PARTS,
    ExponentialThink,
    SessionConfig,
    ThinkBase,
    UniformThink,
    session_turns,
    turn_part,
)
from ._sockets import TCP_CLOSE, TCP_CLOSE_WAIT, peer_cut, tcp_state
from ._sse import SSEDecoder, SSEEvent
from ._tail import LineTail
from ._trace_formats import TRACE_FORMATS, TraceError, TraceFormat
from ._traces import PlannedArrivals, TraceArrivals, read_trace
from ._vanish import VANISH_TABLE_ENV, VanishError
from ._workers import (
    WORKER_DIR_ENV,
    WORKER_FORWARD_ENV,
    WORKER_NAME_ENV,
    group_file,
    group_files,
    group_of,
    locustfile_source,
    valid_worker_name,
    worker_of,
    workers_log,
)

if TYPE_CHECKING:
    from ._lifecycle import exit_zero_on_request_failures, quit_when_users_done
    from ._saturation import sample_saturation
    from ._sessions import SessionUser
    from ._users import (
        OpenLoopUser,
        RequestOutcomeError,
        SlowReaderUser,
        StreamingUser,
        user_class_from_config,
    )

_LAZY = {
    "StreamingUser": "._users",
    "SlowReaderUser": "._users",
    "OpenLoopUser": "._users",
    "RequestOutcomeError": "._users",
    "user_class_from_config": "._users",
    "quit_when_users_done": "._lifecycle",
    "exit_zero_on_request_failures": "._lifecycle",
    "sample_saturation": "._saturation",
    "SessionUser": "._sessions",
}

__all__ = [
    "CONVERSATION_FORMATS",
    "ConversationError",
    "ConversationFormat",
    "RecordedSession",
    "RecordedTurn",
    "read_conversations",
    "THINK_TIMES",
    "TURN_PARTS",
    "ExponentialThink",
    "SessionConfig",
    "SessionUser",
    "ThinkBase",
    "UniformThink",
    "session_turns",
    "turn_part",
    "ClockEstimate",
    "clock_estimates",
    "to_harness_clock",
    "ACTIONS",
    "ARRIVALS",
    "ArrivalBase",
    "ArrivalConfig",
    "ConstantArrivals",
    "RateArrivals",
    "GammaArrivals",
    "PlannedRequest",
    "PoissonArrivals",
    "OpenLoopUser",
    "TRACE_FORMATS",
    "PlannedArrivals",
    "TraceArrivals",
    "TraceError",
    "TraceFormat",
    "read_trace",
    "LENGTHS",
    "FixedLength",
    "LengthBase",
    "LengthConfig",
    "LognormalLength",
    "NormalLength",
    "UniformLength",
    "AbortiveClose",
    "ActionConfig",
    "Chunk",
    "ClientAction",
    "ENDPOINT_PATHS",
    "Endpoint",
    "FullSpeed",
    "GroupRunConfig",
    "HalfClose",
    "LineTail",
    "OUTCOMES",
    "Paced",
    "READS",
    "ReadBehaviour",
    "ReadConfig",
    "RecordWriter",
    "Registry",
    "RequestOutcomeError",
    "RequestRecord",
    "RequestSpec",
    "new_traceparent",
    "trace_ids",
    "SATURATION_ENV",
    "SSEDecoder",
    "SSEEvent",
    "SlowReaderUser",
    "Leave",
    "LEAVE_STYLES",
    "LeaveStyle",
    "Stall",
    "StopReading",
    "StreamingUser",
    "TCP_CLOSE",
    "TCP_CLOSE_WAIT",
    "TokenCounter",
    "UnknownKindError",
    "VANISH_TABLE_ENV",
    "VanishError",
    "UserGroupConfig",
    "WORKER_DIR_ENV",
    "WORKER_FORWARD_ENV",
    "WORKER_NAME_ENV",
    "build_prompt",
    "exit_zero_on_request_failures",
    "group_file",
    "group_files",
    "locustfile_source",
    "parse_payload",
    "peer_cut",
    "prompt_seed",
    "quit_when_users_done",
    "read_records",
    "request_body",
    "sample_saturation",
    "stream_request",
    "tcp_state",
    "ttft_ms",
    "user_class_from_config",
    "valid_worker_name",
    "group_of",
    "worker_of",
    "workers_log",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value
