"""Recorded conversations to replay as sessions (``session = { file = ..., format = ... }``),
in formats registered by name in :data:`CONVERSATION_FORMATS` (a :class:`zwcore.Registry`,
as trace formats are: a new format is one :class:`ConversationFormat` subclass and one
``@CONVERSATION_FORMATS.register``).

- ``zerowindow`` (JSON lines, ours): one session per line, ``{"id": "s1", "turns": [{"user":
  "text", "max_tokens": 64, "think_s": 1.5}, ...]}``. A turn gives its user message as text
  (``user``) or as a length (``user_tokens``: a deterministic message of that many words,
  ``loadgen._prompt``); ``max_tokens`` (default: the group's) and ``think_s``, the pause before
  this turn is sent (default: the session's ``think_s``; not used on the first turn), are
  optional. ``id`` is optional (default: the line number). Empty lines are skipped.
- ``sharegpt``: the layout vLLM's benchmarks (``benchmarks/multi_turn``, ``vllm bench serve
  --dataset-name sharegpt``) and guidellm read: a JSON list of ``{"id", "conversations":
  [{"from": "human" | "gpt", "value"}]}``. The human turns are sent; the length of the gpt
  answer that follows one (in words, as prompts are counted: ``loadgen._prompt``) is its
  ``max_tokens``, the group's for a human turn with no answer after it. Messages from anyone
  else (``system``) are skipped; an entry without a human turn is an error.

Errors name the file and the line (JSON lines) or the entry (a JSON list).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from zwcore import Registry


class ConversationError(ValueError):
    """A conversation file that cannot be read as its format: the message names the file,
    the line or entry, and what is wrong."""


class RecordedTurn(BaseModel):
    """One user turn of a recorded session: its message (``user`` text, or ``user_tokens``,
    the length of a deterministic message), and optionally ``max_tokens`` and ``think_s`` (the
    pause before it is sent, s)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    user: str | None = Field(None, min_length=1, description="the user message")
    user_tokens: int | None = Field(
        None, ge=1, description="or its length: a deterministic message of that many words"
    )
    max_tokens: int | None = Field(None, ge=1, description="default: the group's")
    think_s: float | None = Field(
        None, ge=0, description="pause before it is sent (s); default: the session's think_s"
    )

    @model_validator(mode="after")
    def _one_message(self) -> RecordedTurn:
        if (self.user is None) == (self.user_tokens is None):
            raise ValueError("give the turn's message as user (text) or user_tokens, one of them")
        return self


class RecordedSession(BaseModel):
    """One recorded session: ``id`` and its user ``turns`` in order (at least one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="the session's name in its file")
    turns: list[RecordedTurn] = Field(min_length=1, description="its user turns, in order")


class ConversationFormat:
    """A conversation file format, registered in :data:`CONVERSATION_FORMATS` under its
    ``kind`` class attribute and instantiated without arguments each time a file is read."""

    kind: ClassVar[str]

    def read(self, path: Path) -> list[RecordedSession]:
        """Every session of the file at ``path``, in file order. Raises
        :class:`ConversationError` naming the file and the line or entry."""
        raise NotImplementedError


CONVERSATION_FORMATS: Registry[ConversationFormat] = Registry("conversation format")


def _problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        return f"{where}: {err['msg']}" if where else str(err["msg"])
    return str(exc)


@CONVERSATION_FORMATS.register
class ZerowindowConversations(ConversationFormat):
    """JSON lines, one session per line (see the module docstring)."""

    kind = "zerowindow"

    def read(self, path: Path) -> list[RecordedSession]:
        sessions = []
        with path.open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    data = json.loads(line)
                    if not isinstance(data, dict):
                        raise ValueError("a session is a JSON object")
                    data.setdefault("id", str(n))
                    sessions.append(RecordedSession.model_validate(data))
                except (ValueError, ValidationError) as exc:
                    problem = _problem(exc)
                    raise ConversationError(f"{path}:{n}: not a session ({problem})") from None
        return sessions


@CONVERSATION_FORMATS.register
class ShareGPT(ConversationFormat):
    """A JSON list of ``{"id", "conversations": [{"from", "value"}]}`` (see the module
    docstring)."""

    kind = "sharegpt"

    def read(self, path: Path) -> list[RecordedSession]:
        try:
            entries = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ConversationError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from None
        if not isinstance(entries, list):
            raise ConversationError(f"{path}: a ShareGPT file is a JSON list of conversations")
        return [self._session(path, i, entry) for i, entry in enumerate(entries)]

    @staticmethod
    def _session(path: Path, index: int, entry: Any) -> RecordedSession:
        where = f"{path}: entry {index}"
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise ConversationError(f"{where}: needs a list under 'conversations'")
        where += f" (id {entry.get('id')!r})" if "id" in entry else ""
        turns: list[dict[str, Any]] = []
        for j, message in enumerate(entry["conversations"]):
            if not isinstance(message, dict) or not isinstance(message.get("value"), str):
                raise ConversationError(f"{where}: message {j} needs a string 'value'")
            speaker, text = message.get("from"), message["value"]
            if speaker == "human" and text.strip():
                turns.append({"user": text})
            elif speaker == "gpt" and turns and "max_tokens" not in turns[-1]:
                turns[-1]["max_tokens"] = max(1, len(text.split()))
        if not turns:
            raise ConversationError(f"{where}: no human turn to send")
        return RecordedSession(id=str(entry.get("id", index)), turns=turns)


def read_conversations(path: Path, fmt: str) -> list[RecordedSession]:
    """Every session of the file at ``path`` in the format named ``fmt``, in file order.
    Raises :class:`ConversationError` naming the file and the problem (an unreadable file, one
    with no session) and :class:`zwcore.UnknownKindError` listing the formats for an unknown
    ``fmt``."""
    reader = CONVERSATION_FORMATS.get(fmt)()
    try:
        sessions = reader.read(path)
    except ConversationError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ConversationError(f"{path}: cannot read it ({exc})") from None
    if not sessions:
        raise ConversationError(f"{path}: no session in the file")
    return sessions


@dataclass(frozen=True)
class TurnPlan:
    """One turn as a session sends it: the user message (text), its length in words (about
    tokens: ``loadgen._prompt``), and, from a recording, its ``max_tokens`` and the pause
    before it (``None``: the group's, the session's)."""

    text: str
    words: int
    max_tokens: int | None = None
    think_s: float | None = None
