"""Sessions: a closed-loop group's users hold multi-turn conversations instead of sending
independent requests (``session = { turns = 4, think_s = 2, sessions_per_user = 2 }``).

Each turn's prompt is the conversation so far, the earlier user messages and the assistant's
answers as the client received them (the record's chunk texts), then a new user message, sent
as chat ``messages`` (so ``endpoint = "chat"``). The messages come from the seed (a user's
``prompt_tokens``-word message per turn, ``loadgen._prompt``) or from a file of recorded
conversations (``file``, ``format``: ``loadgen._conversations``).

``turns``: turns per session, a number or a length distribution (``loadgen._lengths``: its
counts read as turns). ``think_s``: the pause between a turn's end and the next turn's send
(s), a number or a distribution (:data:`THINK_TIMES`). ``action_turns``: the 1-based turns on
which the group's read behaviour and action (or its mix's) apply; the other turns read at full
speed without action. Empty (the default): every turn.

After a turn that ended ``complete`` or ``client_abort`` (the client's own action: it stopped
reading, closed, left) the session goes on with what the client received. Any other outcome
(an HTTP error, an error event, a cut by the server, a timeout) ends the session there; the
record of a session's last turn says why in ``session_end``: ``"done"`` (every turn sent) or
``"turn_failed"``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from zwcore import Registry

from ._conversations import (
    CONVERSATION_FORMATS,
    ConversationError,
    RecordedSession,
    TurnPlan,
    read_conversations,
)
from ._lengths import LengthBase, TokenCount, draw_tokens
from ._prompt import build_prompt, prompt_seed

CONTINUING_OUTCOMES = ("complete", "client_abort")
"""Turn outcomes after which a session sends its next turn."""
TURN_PARTS = ("turn1", "later_turns")
"""The per-turn summaries of a session group: ``<group>.turn1.<figure>`` (each session's
first turn, nothing cached yet) and ``<group>.later_turns.<figure>`` (turns 2 and on)."""


def turn_part(turn: int) -> str:
    """The per-turn summary (:data:`TURN_PARTS`) that 1-based ``turn`` counts in."""
    return TURN_PARTS[0] if turn == 1 else TURN_PARTS[1]


class ThinkBase(BaseModel):
    """A distribution of think times (a kind subclasses this and registers with
    :data:`THINK_TIMES`); :meth:`draw` gives one pause in seconds (at least 0)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str

    def draw(self, rng: random.Random) -> float:
        """One pause (s)."""
        raise NotImplementedError


THINK_TIMES: Registry[ThinkBase] = Registry("think time distribution")


@THINK_TIMES.register
class UniformThink(ThinkBase):
    """A pause from ``min_s`` to ``max_s``, each as likely."""

    kind: Literal["uniform"] = "uniform"
    min_s: float = Field(ge=0)
    max_s: float = Field(ge=0)

    @model_validator(mode="after")
    def _ordered(self) -> UniformThink:
        if self.max_s < self.min_s:
            raise ValueError(f"max_s={self.max_s} is below min_s={self.min_s}")
        return self

    def draw(self, rng: random.Random) -> float:
        return rng.uniform(self.min_s, self.max_s)


@THINK_TIMES.register
class ExponentialThink(ThinkBase):
    """Exponential pauses of mean ``mean_s``, cut at ``max_s`` when given (memoryless users)."""

    kind: Literal["exponential"] = "exponential"
    mean_s: float = Field(gt=0)
    max_s: float | None = Field(None, gt=0)

    def draw(self, rng: random.Random) -> float:
        pause = rng.expovariate(1.0 / self.mean_s)
        return pause if self.max_s is None else min(self.max_s, pause)


class _ThinkField:
    """Pydantic metadata of :data:`ThinkTime`: a number of seconds, or a table by ``kind``."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_plain_validator_function(
            _validate_think,
            serialization=core_schema.plain_serializer_function_ser_schema(
                lambda v: v if isinstance(v, float | int) else v.model_dump(mode="json")
            ),
        )

    def __get_pydantic_json_schema__(
        self, schema: Any, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {
            "oneOf": [{"type": "number", "minimum": 0}, *THINK_TIMES.json_schema_variants(handler)],
            "description": "seconds: a number, or a distribution chosen by its `kind`: "
            + ", ".join(THINK_TIMES.kinds()),
        }


def _validate_think(value: Any) -> float | ThinkBase:
    if isinstance(value, int | float) and not isinstance(value, bool):
        if value < 0 or not math.isfinite(value):
            raise PydanticCustomError("greater_than_equal", "Input should be at least 0 (s)")
        return float(value)
    if isinstance(value, BaseModel | Mapping):
        return THINK_TIMES.validate_value(value)
    raise PydanticCustomError(
        "think_time", "expected seconds, or a table with a `kind`: {kinds}",
        {"kinds": ", ".join(THINK_TIMES.kinds())},
    )  # fmt: skip


ThinkTime = Annotated[float | ThinkBase, _ThinkField()]
"""A pause in seconds: a number, or a distribution."""


def draw_think_s(value: float | ThinkBase, rng: random.Random) -> float:
    """``value`` itself, or one draw of the distribution (s)."""
    return value if isinstance(value, float | int) else value.draw(rng)


class SessionConfig(BaseModel):
    """A group's multi-turn conversations: each turn sends the conversation so far (earlier
    user messages, the answers as received) and a new user message, as chat ``messages``.
    Messages come from the seed (``turns`` turns of the group's ``prompt_tokens`` words) or
    from a recorded ``file`` (``format``: ``zerowindow`` JSON lines or ``sharegpt``; see
    ``docs/load.md``). ``think_s`` (s, a number or a ``uniform``/``exponential``
    distribution) passes between a turn's end and the next send. The group's read and action
    apply on ``action_turns`` (every turn when empty); the other turns read at full speed. A turn
    that ends ``complete`` or ``client_abort`` (the client's own action) lets the session go
    on with what was received; any other outcome ends it (``session_end = "turn_failed"``).

    Validation errors name the field: ``turns`` with ``file`` or neither, an unknown format, a
    file that is not of its format (with its line or entry)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turns: TokenCount | None = Field(
        None, description="turns per session: a number or a length distribution (of turns)"
    )
    think_s: ThinkTime = Field(0.0, description="pause between a turn's end and the next send")
    sessions_per_user: int = Field(1, ge=1, description="sessions each user runs, one by one")
    action_turns: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        description="1-based turns on which the group's read and action apply (others read at "
        "full speed); empty: every turn",
    )
    file: Path | None = Field(
        None, description="recorded conversations to replay (a relative path: from where you run)"
    )
    format: str = Field(
        "zerowindow",
        description="the file's format, a registered conversation format (built in: "
        + ", ".join(CONVERSATION_FORMATS.kinds())
        + ")",
    )
    recorded: list[RecordedSession] = Field(
        default_factory=list,
        description="sessions carried whole: what a file becomes in the locustfile sent to "
        "workers (which may not have the file)",
    )

    @field_validator("file")
    @classmethod
    def _exists(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        path = path.expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"no conversation file at {path}")
        return path

    @model_validator(mode="after")
    def _turns_or_file(self) -> SessionConfig:
        given = [f for f in ("turns", "file", "recorded") if getattr(self, f)]
        if len(given) != 1:
            raise ValueError(
                "session: give turns (synthetic sessions) or file (recorded ones to replay), "
                f"one of them (got {', '.join(given) or 'neither'})"
            )
        if self.file is None:
            return self
        CONVERSATION_FORMATS.get(self.format)  # lists the registered formats
        try:
            read_conversations(self.file, self.format)
        except ConversationError as exc:
            raise ValueError(f"session.file: {exc}") from None
        return self

    def sessions(self) -> list[RecordedSession]:
        """The recorded sessions to replay (read from ``file`` each call, or carried in
        ``recorded``); empty for synthetic sessions. Raises :class:`ConversationError`."""
        if self.file is not None:
            return read_conversations(self.file, self.format)
        return list(self.recorded)

    def applies_on(self, turn: int) -> bool:
        """Whether the group's read and action apply on 1-based ``turn``."""
        return not self.action_turns or turn in self.action_turns


def session_turns(
    session: SessionConfig,
    own_seed: int,
    *,
    prompt_tokens: int | LengthBase,
    recorded: list[RecordedSession] | None = None,
    order: int = 0,
) -> list[TurnPlan]:
    """The turns of one session: the recorded session at position ``order`` (modulo their
    number) when there are ``recorded`` sessions; otherwise ``session.turns`` turns of
    ``prompt_tokens``-word messages (each a number or a ``loadgen._lengths`` distribution),
    drawn from ``own_seed``, the session's own seed."""
    if recorded:
        chosen = recorded[order % len(recorded)]
        return [
            TurnPlan(
                t.user if t.user is not None else build_prompt(
                    t.user_tokens or 1, prompt_seed(own_seed, k)
                ),
                t.user_tokens or len((t.user or "").split()),
                t.max_tokens,
                t.think_s,
            )
            for k, t in enumerate(chosen.turns, 1)
        ]  # fmt: skip
    assert session.turns is not None  # validated: turns, file or recorded
    turns = draw_tokens(session.turns, random.Random(prompt_seed(own_seed, "turns")))
    plans = []
    for k in range(1, turns + 1):
        words = draw_tokens(prompt_tokens, random.Random(prompt_seed(own_seed, k, "lengths")))
        plans.append(TurnPlan(build_prompt(words, prompt_seed(own_seed, k)), words))
    return plans
