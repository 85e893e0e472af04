"""Trace replay: an open-loop plan read from a recorded trace (``arrival = { kind = "trace",
format = ..., path = ... }``).

``format`` names a trace format registered in :data:`~loadgen._trace_formats.TRACE_FORMATS`,
each read in its own time unit (``time_unit`` overrides the numeric ones): ``mooncake`` (JSON
lines, milliseconds, ``hash_ids`` as shared prompt prefixes), ``azure`` and ``burstgpt`` (CSV),
``zerowindow`` (a past run's requests, with each request's client behaviour); see each format's
class for its columns and source.

The plan's times are the trace's, from its first request: ``start_s`` and ``end_s`` crop a
window of them (trace seconds, before scaling), ``time_scale`` multiplies the offsets (0.5
replays twice as fast) and ``requests`` keeps the first N. Lengths come from the trace;
``max_tokens`` of at least 1 and prompts of at least 1 token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ._arrivals import ARRIVALS, ArrivalBase, PlannedRequest
from ._config import ClientMixEntry
from ._trace_formats import MOONCAKE_BLOCK_TOKENS, TRACE_FORMATS, TimeUnit, TraceError

_BUILT_IN_FORMATS = ", ".join(TRACE_FORMATS.kinds())


def _format_names(schema: dict[str, Any]) -> None:
    """JSON Schema of ``format``: the names registered when the schema is made."""
    schema["enum"] = TRACE_FORMATS.kinds()


@ARRIVALS.register
class TraceArrivals(ArrivalBase):
    """Requests when, and as long as, a trace says (see the module docstring)."""

    kind: Literal["trace"] = "trace"
    format: str = Field(
        description=f"a registered trace format, by name (built in: {_BUILT_IN_FORMATS})",
        json_schema_extra=_format_names,
    )
    path: Path = Field(description="the trace file (a relative path: from where you run)")
    time_unit: TimeUnit | None = Field(
        None, description="unit of numeric timestamps; default: the format's own"
    )
    time_scale: float = Field(1.0, gt=0, description="offsets multiplied by this")
    start_s: float = Field(0.0, ge=0, description="trace time where the window starts (s)")
    end_s: float | None = Field(None, gt=0, description="trace time where it ends (s)")
    requests: int | None = Field(None, ge=1, description="keep the first N of the window")
    block_tokens: int = Field(
        MOONCAKE_BLOCK_TOKENS, ge=1, description="prompt tokens per hash id (mooncake)"
    )

    @field_validator("format")
    @classmethod
    def _registered(cls, name: str) -> str:
        TRACE_FORMATS.get(name)  # UnknownKindError (a ValueError) lists the registered ones
        return name

    @field_validator("path")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        path = path.expanduser().resolve()
        if not path.exists():
            raise ValueError(f"no trace at {path}")
        return path

    @model_validator(mode="after")
    def _readable(self) -> TraceArrivals:
        """The trace is read once here, so that a file that is not of its format, or a window
        with no request, is an invalid scenario before anything starts."""
        try:
            planned = self.plan(0)
        except TraceError as exc:
            raise ValueError(str(exc)) from None
        if not planned:
            raise ValueError(f"{self.path}: no request in the trace's window")
        return self

    def plan(self, seed: int) -> list[PlannedRequest]:
        """The trace's requests in the window, as planned requests. Raises
        :class:`TraceError` for a file that is not of its format."""
        rows = read_trace(self.path, self.format, self.time_unit)
        window = [
            r for r in rows
            if r.offset_s >= self.start_s and (self.end_s is None or r.offset_s < self.end_s)
        ]  # fmt: skip
        if self.requests is not None:
            window = window[: self.requests]
        if not window:
            return []
        t0 = window[0].offset_s
        return [
            PlannedRequest(
                offset_s=(r.offset_s - t0) * self.time_scale,
                prompt_tokens=r.prompt_tokens,
                max_tokens=r.max_tokens,
                prefix_blocks=r.prefix_blocks,
                behaviour=r.behaviour,
                block_tokens=self.block_tokens,
            )
            for r in window
        ]


class PlannedEntry(BaseModel):
    """One request of a ``planned`` arrival (the fields of a trace's request)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    offset_s: float = Field(ge=0, description="when it is sent, from the first request (s)")
    prompt_tokens: int | None = Field(None, ge=1, description="default: the group's")
    max_tokens: int | None = Field(None, ge=1, description="default: the group's")
    prefix_blocks: tuple[int, ...] = Field(
        (), description="ids of the prompt's blocks: requests sharing leading ids share a prefix"
    )
    behaviour: ClientMixEntry | None = Field(
        None, description="how its client reads and acts (default: the group's)"
    )
    block_tokens: int = Field(MOONCAKE_BLOCK_TOKENS, ge=1, description="tokens per prefix block")


@ARRIVALS.register
class PlannedArrivals(ArrivalBase):
    """Requests planned elsewhere and carried whole (``requests``, in send order): what a trace
    group becomes in the locustfile its Locust master sends its workers, so that a worker on
    another machine, which cannot read the trace file, replays the same plan. ``source`` says
    what it was planned from."""

    kind: Literal["planned"] = "planned"
    requests: list[PlannedEntry] = Field(description="the requests, offsets ascending")
    source: str = Field("", description="what the plan was made from (a trace file)")

    @field_validator("requests")
    @classmethod
    def _in_send_order(cls, requests: list[PlannedEntry]) -> list[PlannedEntry]:
        for i in range(1, len(requests)):
            if requests[i].offset_s < requests[i - 1].offset_s:
                raise ValueError(f"request {i} is sent before request {i - 1}: sort by offset_s")
        return requests

    @classmethod
    def from_trace(cls, trace: TraceArrivals, seed: int) -> PlannedArrivals:
        """``trace``'s plan, read here. Raises :class:`TraceError` for an unreadable trace."""
        entries = [
            PlannedEntry(
                offset_s=p.offset_s, prompt_tokens=p.prompt_tokens, max_tokens=p.max_tokens,
                prefix_blocks=p.prefix_blocks, behaviour=p.behaviour, block_tokens=p.block_tokens,
            )
            for p in trace.plan(seed)
        ]  # fmt: skip
        return cls(
            requests=entries,
            source=f"{trace.format} trace {trace.path}",
            max_concurrency=trace.max_concurrency,
        )

    def plan(self, seed: int) -> list[PlannedRequest]:
        """The carried requests (``seed`` is not used: the plan is made)."""
        return [
            PlannedRequest(
                e.offset_s, e.prompt_tokens, e.max_tokens, e.prefix_blocks, e.behaviour,
                e.block_tokens,
            )
            for e in self.requests
        ]  # fmt: skip


def read_trace(path: Path, fmt: str, time_unit: TimeUnit | None = None) -> list[PlannedRequest]:
    """Every request of the trace at ``path`` in the format named ``fmt``, sorted by time,
    offsets from the first (s). Raises :class:`TraceError` naming the file and the problem, and
    :class:`zwcore.UnknownKindError` (listing the registered formats) for an unknown ``fmt``."""
    reader = TRACE_FORMATS.get(fmt)()
    try:
        rows = reader.read(path, time_unit)
    except TraceError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TraceError(f"{path}: not a {fmt} trace ({type(exc).__name__}: {exc})") from None
    rows.sort(key=lambda r: r.offset_s)
    if not rows:
        return rows
    t0 = rows[0].offset_s
    return [_at(r, r.offset_s - t0) for r in rows]


def _at(row: PlannedRequest, offset_s: float) -> PlannedRequest:
    return PlannedRequest(
        offset_s, max(1, row.prompt_tokens or 1), max(1, row.max_tokens or 1),
        row.prefix_blocks, row.behaviour,
    )  # fmt: skip
