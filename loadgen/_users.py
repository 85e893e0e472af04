"""Locust user classes that stream from an OpenAI-compatible server and record every request.

Importing this module imports Locust, which monkey-patches the standard library for gevent;
``loadgen/__init__`` therefore loads it only when one of its names is used.

Configure a user by class attributes in any plain locustfile::

    from loadgen import SlowReaderUser, Paced, StopReading

    class Aggressor(SlowReaderUser):
        host = "http://127.0.0.1:8000"
        model = "tiny"
        read = Paced(bytes_per_read=64, interval_s=0.1)
        action = StopReading(after_tokens=16, hold_s=30)

Each request writes one :class:`~loadgen._records.RequestRecord` to the records file
(class attribute ``records_path``, else environment variable ``ZW_RECORDS``, else
``records.jsonl`` in the working directory) and fires two Locust request events, ``TTFT``
and ``E2E`` (response times in ms), named after the group. Requests whose outcome is
``complete`` or ``client_abort`` count as successes; any other outcome is a Locust failure.
A request in flight when Locust stops the user (``--run-time``, SIGTERM, web UI stop) is
still recorded, as ``client_abort`` with error ``interrupted: GreenletExit``.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import gevent
import gevent.event
from gevent.lock import BoundedSemaphore
from gevent.pool import Group
from locust import User, constant, task
from locust.exception import StopUser

from ._actions import ACTIONS, ActionConfig
from ._arrivals import ArrivalBase, PlannedRequest, share
from ._client import stream_request
from ._config import ClientMixEntry, UserGroupConfig
from ._lengths import LengthBase, draw_tokens
from ._openai import Endpoint
from ._prompt import build_prefixed_prompt, build_prompt, prompt_seed
from ._reads import READS, FullSpeed, Paced, ReadConfig
from ._records import RecordWriter, RequestRecord
from ._request import RequestSpec

RECORDS_ENV = "ZW_RECORDS"
DEFAULT_RECORDS_PATH = "records.jsonl"
SUCCESS_OUTCOMES = ("complete", "client_abort")

_writers: dict[Path, RecordWriter] = {}
_writers_lock = threading.Lock()


def _writer(path: Path) -> RecordWriter:
    key = path.resolve()
    with _writers_lock:
        writer = _writers.get(key)
        if writer is None:
            writer = _writers[key] = RecordWriter(key)
        return writer


class RequestOutcomeError(Exception):
    """The Locust failure for a request whose outcome is not a success: ``outcome: error``."""

    def __init__(self, outcome: str, error: str | None) -> None:
        super().__init__(f"{outcome}: {error}" if error else outcome)
        self.outcome = outcome


class StreamingUser(User):
    """A user that reads its streams at full speed (``recv(65536)``).

    Class attributes (override in a subclass): ``host`` (base URL, ``http://`` only),
    ``model``, ``endpoint`` (``"completions"`` | ``"chat"``), ``stream`` (``False``: each
    answer asked for whole), ``prompt_tokens``,
    ``max_tokens`` (each a number or a ``loadgen._lengths`` distribution, drawn per
    request), ``ignore_eos``, ``min_tokens`` (send ``min_tokens = max_tokens``),
    ``accept_encoding`` (the ``Accept-Encoding`` header, ``None``: none sent),
    ``timeout_s`` (per-request deadline, s), ``read``
    (:data:`ReadConfig`), ``action`` (:data:`ActionConfig` or ``None``), ``rcvbuf_bytes``
    (``SO_RCVBUF`` before connect, ``None`` = kernel default), ``mix`` (resolved
    :class:`~loadgen._config.ClientMixEntry` items: each request's read, action and receive
    buffer drawn from them by weight), ``timestamps`` (``"kernel"``:
    full-speed reads stamped with the kernel's arrival time; ``"read"``: when ``recv``
    returned; see :class:`RequestSpec`), ``requests_per_user`` (stop after
    that many, ``None`` = never), ``group_name`` (default: the class name), ``network_profile``,
    ``records_path``, ``seed`` (prompt seed), ``wait_time`` (Locust; default none).

    Raises ``ValueError`` on construction when ``model`` or ``host`` is empty or
    ``read``/``action`` are not valid behaviours.
    """

    abstract = True
    wait_time = constant(0)

    model: ClassVar[str] = ""
    endpoint: ClassVar[Endpoint] = "completions"
    stream: ClassVar[bool] = True
    prompt_tokens: ClassVar[int | LengthBase] = 32
    max_tokens: ClassVar[int | LengthBase] = 128
    ignore_eos: ClassVar[bool] = True
    accept_encoding: ClassVar[str | None] = None
    min_tokens: ClassVar[bool] = False
    timeout_s: ClassVar[float] = 120.0
    read: ClassVar[ReadConfig | dict[str, Any]] = FullSpeed()
    action: ClassVar[ActionConfig | dict[str, Any] | None] = None
    rcvbuf_bytes: ClassVar[int | None] = None
    mix: ClassVar[list[ClientMixEntry]] = []
    timestamps: ClassVar[Literal["kernel", "read"]] = "kernel"
    requests_per_user: ClassVar[int | None] = None
    group_name: ClassVar[str | None] = None
    network_profile: ClassVar[str] = "none"
    records_path: ClassVar[str | os.PathLike[str] | None] = None
    seed: ClassVar[int] = 0

    _zw_instances: ClassVar[itertools.count[int]] = itertools.count()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Instance attributes carry a `_zw_` prefix: Locust's User uses `_group`, `_state`...
        cls = type(self)
        if not cls.model:
            raise ValueError(f"{cls.__name__}.model is empty: set the served model name")
        if not self.host:
            raise ValueError(f"{cls.__name__} has no host: set `host` or pass --host")
        self._zw_read: ReadConfig = READS.parse(cls.read)
        self._zw_action: ActionConfig | None = (
            None if cls.action is None else ACTIONS.parse(cls.action)
        )
        self._zw_group = cls.group_name or cls.__name__
        self._zw_index = next(StreamingUser._zw_instances)
        self._zw_sent = 0
        path = cls.records_path or os.environ.get(RECORDS_ENV) or DEFAULT_RECORDS_PATH
        self._zw_records = _writer(Path(path))

    def request_spec(
        self, seed: int | None = None, planned: PlannedRequest | None = None, **extra: Any
    ) -> RequestSpec:
        """The spec of this user's next request (deterministic prompt per user and request,
        or from ``seed``), with what a trace's ``planned`` request says of it; ``extra`` sets
        more :class:`RequestSpec` fields."""
        cls = type(self)
        if seed is None:
            seed = prompt_seed(cls.seed, self._zw_group, self._zw_index, self._zw_sent)
        planned = planned or PlannedRequest(0.0)
        lengths = random.Random(prompt_seed(seed, "lengths"))
        prompt_tokens = planned.prompt_tokens or draw_tokens(cls.prompt_tokens, lengths)
        max_tokens = planned.max_tokens or draw_tokens(cls.max_tokens, lengths)
        read, action, rcvbuf, behaviour = self._zw_read, self._zw_action, cls.rcvbuf_bytes, None
        stream = cls.stream
        entry = planned.behaviour
        if entry is None and cls.mix:
            entry = random.Random(prompt_seed(seed, "mix")).choices(
                cls.mix, weights=[e.weight for e in cls.mix]
            )[0]
        if entry is not None:
            read = entry.read or read  # resolved entries carry their group's defaults
            action, rcvbuf, behaviour = entry.action, entry.rcvbuf_bytes, entry.name
            stream = entry.stream if entry.stream is not None else stream
        prompt = (
            build_prefixed_prompt(planned.prefix_blocks, planned.block_tokens, prompt_tokens, seed)
            if planned.prefix_blocks
            else build_prompt(prompt_tokens, seed)
        )
        return RequestSpec(
            host=str(self.host),
            model=cls.model,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            endpoint=cls.endpoint,
            stream=stream,
            max_tokens=max_tokens,
            ignore_eos=cls.ignore_eos,
            accept_encoding=cls.accept_encoding,
            min_tokens=cls.min_tokens,
            timeout_s=cls.timeout_s,
            read=read,
            action=action,
            rcvbuf_bytes=rcvbuf,
            behaviour=behaviour,
            timestamps=cls.timestamps,
            user_class=cls.__name__,
            group=self._zw_group,
            network_profile=cls.network_profile,
            **extra,
        )

    @task
    def stream_once(self) -> None:
        """Send one request, record it, report it to Locust; stop after ``requests_per_user``."""
        limit = type(self).requests_per_user
        if limit is not None and self._zw_sent >= limit:  # also ends a user whose task raised
            raise StopUser()
        spec = self.request_spec()
        self._zw_sent += 1
        record = stream_request(spec, on_interrupt=self._zw_records.write)
        self._zw_records.write(record)
        self.report(record)
        if limit is not None and self._zw_sent >= limit:
            raise StopUser()

    def report(self, record: RequestRecord) -> None:
        """Fire Locust ``request`` events ``TTFT`` and ``E2E`` (ms) for ``record``."""
        end = record.t_end if record.t_end is not None else record.t_send
        e2e_ms = (end - record.t_send) * 1000.0
        failure = (
            None
            if record.outcome in SUCCESS_OUTCOMES
            else RequestOutcomeError(record.outcome, record.error)
        )
        common: dict[str, Any] = {
            "name": self._zw_group,
            "response": None,
            "context": {"request_id": record.request_id, "outcome": record.outcome},
            "start_time": record.t_send_wall,
            "url": None,
        }
        fire = self.environment.events.request.fire
        if (ttft_ms := record.ttft_ms) is not None:
            fire(
                request_type="TTFT",
                response_time=ttft_ms,
                response_length=0,
                exception=None,
                **common,
            )
        else:
            no_token = failure or RequestOutcomeError(record.outcome, "no output token")
            fire(
                request_type="TTFT",
                response_time=e2e_ms,
                response_length=0,
                exception=no_token,
                **common,
            )
        fire(
            request_type="E2E",
            response_time=e2e_ms,
            response_length=record.bytes_received,
            exception=failure,
            **common,
        )


class SlowReaderUser(StreamingUser):
    """A user that reads slowly: ``Paced(bytes_per_read=64, interval_s=0.1)`` through a
    ``SO_RCVBUF`` of 4096 bytes (8192 after Linux doubles it, socket(7)) by default, and
    optionally acts on its connection after N tokens (``action``). Same attributes as
    :class:`StreamingUser`.
    """

    abstract = True
    read: ClassVar[ReadConfig | dict[str, Any]] = Paced()
    rcvbuf_bytes: ClassVar[int | None] = 4096


_schedule_start: dict[str, float] = {}
_schedule_started = gevent.event.Event()
SCHEDULE_START_WAIT_S = 5.0
"""How long a worker's dispatcher waits for its master to say when the shared schedule starts."""


def schedule_starts_at(t0: float) -> None:
    """The master said when this worker's share of a shared open-loop schedule starts: ``t0``,
    monotonic s on this process's clock (``loadgen._distributed``)."""
    _schedule_start["t0"] = t0
    _schedule_started.set()


def _shared_start() -> float:
    """When a schedule split between workers starts here: the master's moment, or, if it did
    not come within ``SCHEDULE_START_WAIT_S``, now (logged: the shares may then be skewed)."""
    if _schedule_started.wait(SCHEDULE_START_WAIT_S):
        return _schedule_start["t0"]
    logging.getLogger(__name__).warning(
        "no schedule start from the master within %.0f s: this worker's share starts now",
        SCHEDULE_START_WAIT_S,
    )
    return time.monotonic()


class OpenLoopUser(StreamingUser):
    """Sends its group's requests on an open-loop schedule (``arrival``, see
    ``loadgen._arrivals``) instead of one after another: each at its deadline in a greenlet of
    its own, at most ``arrival.max_concurrency`` in flight. It is a dispatcher, not a
    simulated user: one per load process. Of a schedule shared by ``schedule_processes``
    processes (Locust workers) it sends the share of its worker index; a second dispatcher in
    the same process sends nothing. Each request's prompt is seeded by its position in the
    whole schedule, so a schedule sends the same prompts however it is split. Same attributes
    as :class:`StreamingUser`, plus ``arrival`` and ``schedule_processes``.
    """

    abstract = True
    arrival: ClassVar[ArrivalBase | None] = None
    schedule_processes: ClassVar[int] = 1
    _zw_dispatching: ClassVar[set[str]] = set()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._zw_pool = Group()

    def _share_index(self) -> int:
        runner = self.environment.runner
        index = getattr(runner, "worker_index", 0) if runner is not None else 0
        return max(0, int(index))

    @task
    def run_schedule(self) -> None:
        """Send this process's share of the schedule, wait for every request, stop."""
        cls = type(self)
        if cls.arrival is None:
            raise ValueError(f"{cls.__name__}.arrival is not set")
        if self._zw_group in OpenLoopUser._zw_dispatching:
            raise StopUser()  # one dispatcher per process and group
        OpenLoopUser._zw_dispatching.add(self._zw_group)
        index = self._share_index()
        if index >= cls.schedule_processes:
            logging.getLogger(__name__).error(
                "group %s: worker index %d has no share of a schedule split %d ways",
                self._zw_group, index, cls.schedule_processes,
            )  # fmt: skip
            raise StopUser()
        plan = cls.arrival.plan(prompt_seed(cls.seed, self._zw_group, "arrivals"))
        cap = cls.arrival.max_concurrency
        slots = BoundedSemaphore(cap) if cap is not None else None
        # Split between workers, the schedule starts at one moment for all (their master's).
        t0 = _shared_start() if cls.schedule_processes > 1 else time.monotonic()
        for position, planned in share(plan, index, cls.schedule_processes):
            deadline = t0 + planned.offset_s
            if (wait := deadline - time.monotonic()) > 0:
                gevent.sleep(wait)
            if slots is not None:
                slots.acquire()
            self._zw_pool.spawn(self._send_scheduled, position, planned, deadline, slots)
        self._zw_pool.join()
        raise StopUser()

    def _send_scheduled(
        self, position: int, planned: PlannedRequest, deadline: float, slots: Any
    ) -> None:
        cls = type(self)
        try:
            spec = self.request_spec(
                seed=prompt_seed(cls.seed, self._zw_group, "request", position),
                planned=planned,
                t_scheduled=deadline,
                schedule_index=position,
            )
            self._zw_sent += 1
            record = stream_request(spec, on_interrupt=self._zw_records.write)
            self._zw_records.write(record)
            self.report(record)
        finally:
            if slots is not None:
                slots.release()

    def on_stop(self) -> None:
        """Locust stops the user (``--run-time``, SIGTERM): end the requests in flight (each is
        recorded as interrupted)."""
        self._zw_pool.kill(block=True, timeout=5)


# Locust adds the tasks of every base class to a subclass's: without this, the closed loop's
# ``stream_once`` would run beside the schedule.
OpenLoopUser.tasks = [OpenLoopUser.run_schedule]


def _class_name(group_name: str) -> str:
    name = re.sub(r"\W+", "_", group_name).strip("_") or "Group"
    return name if not name[0].isdigit() else f"G_{name}"


def user_class_from_config(
    group: UserGroupConfig,
    *,
    host: str,
    model: str,
    records_path: Path,
    seed: int,
    processes: int = 1,
) -> type[User]:
    """A concrete Locust user class for ``group``: ``fixed_count = group.users`` (closed loop)
    or one dispatcher per load process (open loop, ``processes`` of them sharing its schedule).

    The base is :class:`OpenLoopUser` for an open-loop group, ``loadgen._sessions.SessionUser``
    for a group with a ``session``, else :class:`SlowReaderUser` when
    the group paces reads, sets ``rcvbuf_bytes`` or has an action, else
    :class:`StreamingUser`; every field of ``group`` overrides the base's defaults. The class
    name is ``group.name`` made an identifier. ``records_path``: the JSON-lines file the
    records are appended to.
    """
    slow = isinstance(group.read, Paced) or group.rcvbuf_bytes is not None or group.action
    base: type[StreamingUser] = SlowReaderUser if slow else StreamingUser
    extra: dict[str, Any] = {}
    if group.arrival is not None:
        base = OpenLoopUser
        extra = {"arrival": group.arrival, "schedule_processes": processes}
    elif group.session is not None:
        from ._sessions import SessionUser

        base, extra = SessionUser, {"session": group.session, "users": group.users}
    attrs: dict[str, Any] = {
        "__module__": __name__,
        "__doc__": f"User group {group.name!r}.",
        "abstract": False,
        "host": host,
        "model": model,
        "fixed_count": group.locust_users(processes),
        "wait_time": constant(group.wait_s),
        "requests_per_user": group.requests_per_user,
        "group_name": group.name,
        "network_profile": group.network_profile,
        "endpoint": group.endpoint,
        "stream": group.stream,
        "prompt_tokens": group.prompt_tokens,
        "max_tokens": group.max_tokens,
        "ignore_eos": group.ignore_eos,
        "accept_encoding": group.accept_encoding,
        "min_tokens": group.min_tokens,
        "timeout_s": group.timeout_s,
        "read": group.read,
        "action": group.action,
        "rcvbuf_bytes": group.rcvbuf_bytes,
        "mix": group.behaviours(),
        "timestamps": group.timestamps,
        "records_path": Path(records_path),
        "seed": seed,
        **extra,
    }
    return type(_class_name(group.name), (base,), attrs)
