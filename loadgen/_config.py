"""Configuration of one group of identical simulated users (one Locust user class).

The harness's scenario schema embeds :class:`UserGroupConfig`, and ``loadgen/locustfile.py``
reads it from the ``--zw-group-config`` JSON file (see :class:`GroupRunConfig`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from zwcore import load_plugins

from ._actions import ActionConfig
from ._arrivals import ArrivalConfig
from ._lengths import TokenCount
from ._reads import FullSpeed, ReadConfig
from ._session_config import TURN_PARTS, SessionConfig

# Environment variable naming the file where a load process appends its saturation samples
# (CPU use and gevent loop lag); read by ``loadgen._saturation``, set by the harness. It lives
# here because importing ``loadgen._saturation`` imports gevent.
SATURATION_ENV = "ZW_SATURATION"


_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


class ClientMixEntry(BaseModel):
    """One behaviour of a group's client mix: drawn for a request with probability ``weight``
    over the sum of the weights. ``read``, ``action``, ``rcvbuf_bytes`` and ``stream`` default
    to the group's; ``name`` (default: the read kind, then the action kind if any, joined by ``-``)
    labels the requests (``requests.parquet``'s ``behaviour``) and their figures
    (``<group>.<name>.<figure>``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str | None = Field(None, pattern=_NAME, max_length=64)
    weight: float = Field(gt=0, description="relative weight (any positive number)")
    read: ReadConfig | None = None
    action: ActionConfig | None = None
    rcvbuf_bytes: int | None = Field(None, ge=1)
    stream: bool | None = Field(None, description="false: the answer asked for whole")

    def resolved(self, group: UserGroupConfig) -> ClientMixEntry:
        """This entry with the group's defaults filled in and its name set."""
        read = self.read or group.read
        action = self.action if self.action is not None else group.action
        stream = self.stream if self.stream is not None else group.stream
        kinds = [read.kind, *([action.kind] if action else []), *([] if stream else ["whole"])]
        name = self.name or "-".join(kinds)
        rcvbuf = self.rcvbuf_bytes if self.rcvbuf_bytes is not None else group.rcvbuf_bytes
        return self.model_copy(
            update={
                "name": name, "read": read, "action": action, "rcvbuf_bytes": rcvbuf,
                "stream": stream,
            }
        )  # fmt: skip


class UserGroupConfig(BaseModel):
    """``users`` users, each sending ``requests_per_user`` streaming requests one after another
    (a closed loop), or, with ``arrival``, requests sent on an open-loop schedule (see
    ``loadgen._arrivals``) whatever the server does; then ``users`` and
    ``requests_per_user`` do not apply.

    ``wait_s``: pause between a user's requests (s). ``rcvbuf_bytes``: ``SO_RCVBUF`` set before
    ``connect`` (Linux doubles it, socket(7)); ``None`` keeps the default and auto-tuning.
    ``read``: read pacing; ``timestamps``: how reads are stamped, ``"kernel"`` (a full-speed
    reader's reads get the time the kernel received their bytes, ``SO_TIMESTAMPNS``, so the
    load process's scheduling stays out of TTFT and ITL; paced reads and reads after an action
    are always stamped when ``recv`` returns) or ``"read"`` (every read when it returned);
    ``action``: what the client does after N tokens (or ``None``).
    ``mix``: a client mix, the behaviour (read, action, receive buffer) of each request drawn
    from the seed by weight (:class:`ClientMixEntry`); the network profile stays the group's,
    since the group's load process runs behind one link.
    ``network_profile``: label of the link the group's process runs behind (recorded as is).
    ``endpoint``: ``completions`` (``/v1/completions``) or ``chat`` (``/v1/chat/completions``).
    ``stream``: ``False`` asks for each answer whole (``stream: false``).
    ``prompt_tokens``: approximate prompt length (words of a deterministic prompt);
    ``max_tokens``: the output length asked for; either may be a length distribution drawn per
    request (``loadgen._lengths``).
    ``timeout_s``: per-request deadline from send to end. ``start_after_s``: how long after the
    run's load phase begins the group's users start (the harness starts the group's process
    that much later; a plain locustfile ignores it). ``aggressor``: the harness's control arm
    runs the scenario without this group (a plain locustfile ignores it).

    Validation errors (``pydantic.ValidationError``): out-of-range numbers, unknown fields or
    kinds, a ``stall``/``stop_reading`` pause not shorter than ``timeout_s``, a closed loop
    without ``users`` or ``requests_per_user``, an open loop with them, an action that waits
    for tokens of an answer asked for whole; a ``session`` with ``arrival``, with
    ``requests_per_user``, on an endpoint other than ``chat``, with ``action_turns`` past its
    fixed ``turns``, or beside a mix entry named ``turn1`` or ``later_turns``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]*$",
        max_length=64,
        description="letters, digits, '_', '-' (it names the group's files and figures such "
        "as '<group>.ttft_p99_ms', so no '.')",
    )
    users: int | None = Field(None, ge=1, description="closed loop: how many users")
    requests_per_user: int | None = Field(
        None, ge=1, description="closed loop: requests each user sends, one after another"
    )
    arrival: ArrivalConfig | None = Field(
        None, description="open loop: when requests are sent (constant, poisson, gamma)"
    )
    wait_s: float = Field(default=0.0, ge=0)
    rcvbuf_bytes: int | None = Field(default=None, ge=1)
    read: ReadConfig = Field(default_factory=FullSpeed)
    timestamps: Literal["kernel", "read"] = "kernel"
    action: ActionConfig | None = None
    mix: list[ClientMixEntry] = Field(
        default_factory=list, description="behaviours drawn per request by weight"
    )
    network_profile: str = "none"
    endpoint: Literal["completions", "chat"] = "completions"
    stream: bool = Field(
        True,
        description="false: each answer asked for whole (stream: false), so TTFT is the whole "
        "answer's arrival and there is no ITL; actions act at once (after_tokens = 0) or on time "
        "(leave after_s)",
    )
    prompt_tokens: TokenCount = Field(
        default=32, description="prompt length (tokens): a number, or a length distribution"
    )
    max_tokens: TokenCount = Field(
        default=128, description="output length asked for (tokens): a number or a distribution"
    )
    ignore_eos: bool = Field(
        True, description="send ignore_eos (vLLM's extension): answers as long as asked"
    )
    accept_encoding: str | None = Field(
        None,
        description="the Accept-Encoding header sent, e.g. 'gzip' as browsers send it (a "
        "compressing proxy may then hold or compress the stream); gzip and deflate answers "
        "are decoded",
    )
    min_tokens: bool = Field(
        False, description="also send min_tokens = max_tokens (vLLM's sampling parameter)"
    )
    timeout_s: float = Field(default=120.0, gt=0)
    start_after_s: float = Field(default=0.0, ge=0)
    aggressor: bool = Field(
        False,
        description="a group whose cost to the others is under test (slow readers): a "
        "scenario with control = true also runs without it",
    )
    session: SessionConfig | None = Field(
        None,
        description="closed loop, chat: each user holds session.sessions_per_user multi-turn "
        "conversations (in place of requests_per_user)",
    )

    @model_validator(mode="after")
    def _one_loop(self) -> UserGroupConfig:
        if self.arrival is None:
            bounds = ("users",) if self.session else ("users", "requests_per_user")
            missing = [f for f in bounds if getattr(self, f) is None]
            if missing:
                raise ValueError(
                    f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} required "
                    "(or an arrival = { kind = ... } for an open-loop group)"
                )
        else:
            given = [f for f in ("users", "requests_per_user") if getattr(self, f) is not None]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} do not apply to an open-loop group (arrival): "
                    "its arrival's requests or duration_s bound it, max_concurrency caps it"
                )
        return self

    @model_validator(mode="after")
    def _session_fits(self) -> UserGroupConfig:
        session = self.session
        if session is None:
            return self
        if self.arrival is not None:
            raise ValueError(
                "session does not apply to an open-loop group (arrival): a conversation's "
                "next turn waits for the answer before it; use users = N"
            )
        if self.requests_per_user is not None:
            raise ValueError(
                "requests_per_user does not apply with session: session.sessions_per_user "
                "bounds each user (and session.turns each session)"
            )
        if self.endpoint != "chat":
            raise ValueError(
                f'session sends the conversation as chat messages: set endpoint = "chat" '
                f"(got {self.endpoint!r})"
            )
        fixed = session.turns if isinstance(session.turns, int) else None
        if fixed is not None and (late := [t for t in session.action_turns if t > fixed]):
            raise ValueError(
                f"session.action_turns: turn {late[0]} is past session.turns = {session.turns}"
            )
        if clash := [e.name for e in self.mix if e.name in TURN_PARTS]:
            raise ValueError(
                f"mix: the name {clash[0]!r} is a session's per-turn summary "
                f"({', '.join(TURN_PARTS)}): name the entry otherwise"
            )
        return self

    def owners(self) -> list[str]:
        """The names of the group's summaries below its own: ``<group>.<behaviour>`` for
        each mix entry, ``<group>.turn1`` and ``<group>.later_turns`` with a session."""
        parts = [str(b.name) for b in self.behaviours()]
        parts += list(TURN_PARTS) if self.session else []
        return [f"{self.name}.{p}" for p in parts]

    @model_validator(mode="after")
    def _mix_names_differ(self) -> UserGroupConfig:
        names = [e.name for e in self.behaviours()]
        if len(set(names)) < len(names):
            raise ValueError(
                f"mix: behaviour names must differ (got {', '.join(map(str, names))}): "
                "give the entries a name"
            )
        return self

    def behaviours(self) -> list[ClientMixEntry]:
        """The mix's entries with the group's defaults filled in (empty without a mix)."""
        return [e.resolved(self) for e in self.mix]

    @property
    def open_loop(self) -> bool:
        """Whether the group sends on an ``arrival`` schedule."""
        return self.arrival is not None

    def locust_users(self, processes: int = 1) -> int:
        """Locust users of the group when it runs in ``processes`` load processes: its
        ``users`` (closed loop), or one schedule dispatcher per process (open loop)."""
        return processes if self.users is None else self.users

    @model_validator(mode="after")
    def _no_tokens_to_wait_for(self) -> UserGroupConfig:
        pairs = [(self.stream, self.action)] + [(e.stream, e.action) for e in self.behaviours()]
        for stream, action in pairs:
            if not stream and action is not None and action.after_tokens:
                raise ValueError(
                    f"{action.kind} after_tokens = {action.after_tokens} with stream = false: "
                    "an answer asked for whole brings no token before it ends; act at once "
                    "(after_tokens = 0) or on time (leave with after_s)"
                )
        return self

    @model_validator(mode="after")
    def _pause_fits_deadline(self) -> UserGroupConfig:
        for action in [self.action, *(e.action for e in self.mix)]:
            if action is not None and action.pause_s >= self.timeout_s:
                raise ValueError(
                    f"{action.kind}: its pause of {action.pause_s:g} s must be shorter than "
                    f"timeout_s={self.timeout_s}"
                )
        return self


class GroupRunConfig(BaseModel):
    """The JSON file given to ``loadgen/locustfile.py`` with ``--zw-group-config``.

    ``{"group": <UserGroupConfig>, "host": "http://...", "model": "...",
    "records_path": "...", "seed": 0, "processes": 1, "plugins": [...]}``; ``processes``: how
    many load processes (Locust workers) split an open-loop schedule; ``plugins`` (the
    scenario's, see
    :func:`zwcore.load_plugins`) are imported before the group is validated, so that the kinds
    they register are known in the Locust process too.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    plugins: list[str] = []
    group: UserGroupConfig
    host: str
    model: str
    records_path: Path
    seed: int = 0
    processes: int = Field(
        1, ge=1, description="load processes sharing an open-loop schedule (Locust workers)"
    )

    @model_validator(mode="before")
    @classmethod
    def _load_plugins(cls, data: Any) -> Any:
        if isinstance(data, dict):
            load_plugins(data.get("plugins") or [])
        return data

    @classmethod
    def from_file(cls, path: str | Path) -> GroupRunConfig:
        """Read and validate the file. Raises ``OSError`` or ``pydantic.ValidationError``."""
        return cls.model_validate(json.loads(Path(path).read_text(encoding="utf-8")))
