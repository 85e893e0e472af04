"""Trace replay: an open-loop plan read from a recorded trace (``arrival = { kind = "trace",
format = ..., path = ... }``).

Formats, each with the time unit it is read in (``time_unit`` overrides the numeric ones):

- ``mooncake``: JSON lines ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``
  (Mooncake's traces, github.com/kvcache-ai/Mooncake: ``timestamp`` is in milliseconds from
  the trace's start; each hash id names a block of ``block_tokens`` = 512 prompt tokens, so
  requests whose ``hash_ids`` begin alike get prompts that begin alike);
- ``azure``: CSV ``TIMESTAMP`` (a date and time), ``ContextTokens``, ``GeneratedTokens``
  (the Azure LLM inference traces, github.com/Azure/AzurePublicDataset);
- ``burstgpt``: CSV ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens``
  (github.com/HPMLL/BurstGPT); rows whose ``Response tokens`` is 0 (failed requests) are
  kept, with one output token;
- ``zerowindow``: a past run's ``requests.parquet`` (or its run folder): ``t_scheduled`` (else
  ``t_send``) in monotonic seconds, ``prompt_tokens_requested``, ``max_tokens``, and each
  request's client behaviour (read, action, receive buffer) from that run's ``run.json``:
  an incident replayed against another proxy or engine version.

The plan's times are the trace's, from its first request: ``start_s`` and ``end_s`` crop a
window of them (trace seconds, before scaling), ``time_scale`` multiplies the offsets (0.5
replays twice as fast) and ``requests`` keeps the first N. Lengths come from the trace;
``max_tokens`` of at least 1 and prompts of at least 1 token.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from ._arrivals import ARRIVALS, ArrivalBase, PlannedRequest
from ._config import ClientMixEntry, UserGroupConfig

TraceFormat = Literal["mooncake", "azure", "burstgpt", "zerowindow"]
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be read as its format: the message names the file and what is
    wrong (a missing column, a bad line)."""


@ARRIVALS.register
class TraceArrivals(ArrivalBase):
    """Requests when, and as long as, a trace says (see the module docstring)."""

    kind: Literal["trace"] = "trace"
    format: TraceFormat
    path: Path = Field(description="the trace file (a relative path: from where you run)")
    time_unit: Literal["ms", "s"] | None = Field(
        None, description="unit of numeric timestamps; default: the format's own"
    )
    time_scale: float = Field(1.0, gt=0, description="offsets multiplied by this")
    start_s: float = Field(0.0, ge=0, description="trace time where the window starts (s)")
    end_s: float | None = Field(None, gt=0, description="trace time where it ends (s)")
    requests: int | None = Field(None, ge=1, description="keep the first N of the window")
    block_tokens: int = Field(
        MOONCAKE_BLOCK_TOKENS, ge=1, description="prompt tokens per hash id (mooncake)"
    )

    @field_validator("path")
    @classmethod
    def _exists(cls, path: Path) -> Path:
        path = path.expanduser().resolve()
        if not path.exists():
            raise ValueError(f"no trace at {path}")
        return path

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


def read_trace(
    path: Path, fmt: TraceFormat, time_unit: Literal["ms", "s"] | None = None
) -> list[PlannedRequest]:
    """Every request of the trace at ``path``, sorted by time, offsets from the first (s).
    Raises :class:`TraceError` naming the file and the problem."""
    try:
        rows = _READERS[fmt](path, time_unit)
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


def _scale(unit: Literal["ms", "s"] | None, default: Literal["ms", "s"]) -> float:
    return 1e-3 if (unit or default) == "ms" else 1.0


def _mooncake(path: Path, unit: Literal["ms", "s"] | None) -> list[PlannedRequest]:
    scale = _scale(unit, "ms")
    rows = []
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
                rows.append(
                    PlannedRequest(
                        float(r["timestamp"]) * scale,
                        int(r["input_length"]),
                        int(r["output_length"]),
                        tuple(int(h) for h in r.get("hash_ids", [])),
                    )  # fmt: skip
                )
            except (ValueError, KeyError, TypeError) as exc:
                raise TraceError(f"{path}:{n}: not a Mooncake record ({exc!r})") from None
    return rows


def _csv(path: Path, columns: dict[str, str]) -> Any:
    import pandas as pd

    frame = pd.read_csv(path)
    missing = [c for c in columns.values() if c not in frame]
    if missing:
        raise TraceError(
            f"{path}: missing column {', '.join(map(repr, missing))} "
            f"(found {', '.join(map(repr, frame.columns))})"
        )
    return frame


def _azure(path: Path, unit: Literal["ms", "s"] | None) -> list[PlannedRequest]:
    import pandas as pd

    cols = {"t": "TIMESTAMP", "prompt": "ContextTokens", "output": "GeneratedTokens"}
    frame = _csv(path, cols)
    stamps = pd.to_datetime(frame[cols["t"]], format="mixed")
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return [
        PlannedRequest(float(t), int(p), int(o))
        for t, p, o in zip(seconds, frame[cols["prompt"]], frame[cols["output"]], strict=True)
    ]


def _burstgpt(path: Path, unit: Literal["ms", "s"] | None) -> list[PlannedRequest]:
    cols = {"t": "Timestamp", "prompt": "Request tokens", "output": "Response tokens"}
    frame = _csv(path, cols)
    scale = _scale(unit, "s")
    return [
        PlannedRequest(float(t) * scale, int(p), int(o))
        for t, p, o in zip(
            frame[cols["t"]], frame[cols["prompt"]], frame[cols["output"]], strict=True
        )
    ]


def _zerowindow(path: Path, unit: Literal["ms", "s"] | None) -> list[PlannedRequest]:
    import pandas as pd

    folder = path if path.is_dir() else path.parent
    requests = pd.read_parquet(folder / "requests.parquet" if path.is_dir() else path)
    run_json = folder / "run.json"
    try:
        groups = json.loads(run_json.read_text(encoding="utf-8"))["scenario"]["groups"]
    except (OSError, ValueError, KeyError) as exc:
        raise TraceError(f"{run_json}: the run's groups are needed to replay it ({exc})") from None
    behaviours: dict[tuple[str, str | None], ClientMixEntry] = {}
    for data in groups:
        group = UserGroupConfig.model_validate(data)
        own = ClientMixEntry(name=group.name, weight=1).resolved(group)
        behaviours[(group.name, None)] = own
        behaviours.update({(group.name, b.name): b for b in group.behaviours()})
    when = requests["t_scheduled"] if "t_scheduled" in requests else requests["t_send"]
    when = when.fillna(requests["t_send"])
    rows = []
    for t, row in zip(when, requests.to_dict("records"), strict=True):
        mix_name = row.get("behaviour")
        key = (row["group"], mix_name if isinstance(mix_name, str) else None)
        rows.append(
            PlannedRequest(
                float(t),
                int(row["prompt_tokens_requested"]),
                int(row["max_tokens"]),
                behaviour=behaviours.get(key) or behaviours.get((row["group"], None)),
            )  # fmt: skip
        )
    return rows


_READERS = {
    "mooncake": _mooncake,
    "azure": _azure,
    "burstgpt": _burstgpt,
    "zerowindow": _zerowindow,
}
