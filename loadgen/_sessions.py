"""The Locust user of a session group: each task is one multi-turn conversation
(``loadgen._session_config`` says what a session is and what ends it).

Importing this module imports Locust (through ``loadgen._users``).

Everything a session sends comes from the seed: user ``i``'s ``j``-th session is seeded by
(seed, group, ``i``, ``j``), its turns' messages, lengths, think times and its mix behaviour
(drawn once per session: one client holds the conversation) from that; a recorded session is
the file's session ``(seed + i + users * j) mod N`` (``N`` sessions in the file), so repeats and
control arms send the same conversations. Only the assistant answers can differ between runs:
they are what the client received.
"""

from __future__ import annotations

import dataclasses
import random
import uuid
from typing import Any, ClassVar

import gevent
from locust import task
from locust.exception import StopUser

from ._arrivals import PlannedRequest
from ._client import stream_request
from ._config import ClientMixEntry
from ._conversations import RecordedSession, TurnPlan
from ._prompt import prompt_seed
from ._reads import FullSpeed
from ._records import RequestRecord
from ._request import RequestSpec
from ._session_config import CONTINUING_OUTCOMES, SessionConfig, draw_think_s, session_turns
from ._users import StreamingUser

_recorded: dict[int, list[RecordedSession]] = {}


class SessionUser(StreamingUser):
    """A user that runs ``session.sessions_per_user`` sessions one after another (the group's
    ``wait_time`` between them, ``think_s`` between turns), then stops. Same attributes as
    :class:`~loadgen._users.StreamingUser`, plus ``session`` (:class:`SessionConfig`) and
    ``users`` (the group's users: the order recorded sessions are taken in).

    Each turn is one request and one record (``session_id``, ``turn``, ``context_tokens``,
    ``session_end`` on the last). Raises ``ValueError`` on construction without ``session``.
    """

    abstract = True
    session: ClassVar[SessionConfig | None] = None
    users: ClassVar[int] = 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        session = type(self).session
        if session is None:
            raise ValueError(f"{type(self).__name__}.session is not set")
        self._zw_session = session
        self._zw_sessions_run = 0
        key = id(session)  # read the file once per process and group
        if key not in _recorded:
            _recorded[key] = session.sessions()
        self._zw_recorded = _recorded[key]

    @task
    def run_session(self) -> None:
        """Run this user's next session; stop after ``session.sessions_per_user``."""
        if self._zw_sessions_run >= self._zw_session.sessions_per_user:
            raise StopUser()
        number = self._zw_sessions_run
        self._zw_sessions_run += 1
        self.converse(number)
        if self._zw_sessions_run >= self._zw_session.sessions_per_user:
            raise StopUser()

    def converse(self, number: int) -> list[RequestRecord]:
        """Send session ``number``'s turns in order, each after the previous one's answer and a
        think time; return their records (each also written and reported)."""
        cls, session = type(self), self._zw_session
        own = prompt_seed(cls.seed, self._zw_group, "session", self._zw_index, number)
        turns = session_turns(
            session, own, prompt_tokens=cls.prompt_tokens, recorded=self._zw_recorded,
            order=cls.seed + self._zw_index + cls.users * number,
        )  # fmt: skip
        entry = self._session_behaviour(own)
        session_id = uuid.uuid4().hex[:16]
        messages: list[dict[str, str]] = []
        context_tokens = 0
        records: list[RequestRecord] = []
        for k, plan in enumerate(turns, 1):
            if k > 1:
                pause = plan.think_s if plan.think_s is not None else draw_think_s(
                    session.think_s, random.Random(prompt_seed(own, "think", k))
                )  # fmt: skip
                gevent.sleep(pause)
            messages.append({"role": "user", "content": plan.text})
            spec = self._turn_spec(own, k, plan, entry, messages, context_tokens, session_id)
            record = stream_request(spec, on_interrupt=self._zw_records.write)
            went_on = record.outcome in CONTINUING_OUTCOMES
            if not went_on or k == len(turns):
                record.session_end = "done" if went_on else "turn_failed"
            self._zw_records.write(record)
            self.report(record)
            records.append(record)
            if record.session_end is not None:
                break
            answer = "".join(c.text for c in record.chunks)  # as received
            messages.append({"role": "assistant", "content": answer})
            context_tokens += plan.words + sum(c.tokens for c in record.chunks)
        return records

    def _session_behaviour(self, own: int) -> ClientMixEntry | None:
        mix = type(self).mix
        if not mix:
            return None
        return random.Random(prompt_seed(own, "mix")).choices(mix, [e.weight for e in mix])[0]

    def _turn_spec(
        self,
        own: int,
        turn: int,
        plan: TurnPlan,
        entry: ClientMixEntry | None,
        messages: list[dict[str, str]],
        context_tokens: int,
        session_id: str,
    ) -> RequestSpec:
        spec = self.request_spec(
            seed=prompt_seed(own, "turn", turn),
            planned=PlannedRequest(0.0, plan.words, plan.max_tokens, behaviour=entry),
        )
        if not self._zw_session.applies_on(turn):
            spec = dataclasses.replace(spec, read=FullSpeed(), action=None)
        return dataclasses.replace(
            spec,
            prompt=plan.text,
            prompt_tokens=context_tokens + plan.words,
            messages=tuple(dict(m) for m in messages),
            session_id=session_id,
            turn=turn,
            context_tokens=context_tokens,
        )


# Locust adds the tasks of every base class to a subclass's: only the session runs.
SessionUser.tasks = [SessionUser.run_session]
