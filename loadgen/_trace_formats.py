"""Trace file formats, registered by name in :data:`TRACE_FORMATS` (a :class:`zwcore.Registry`):
the name is what a trace arrival's ``format`` says (``arrival = { kind = "trace", format =
"mooncake", ... }``).

A new format is one class and one registration: subclass :class:`TraceFormat`, set its ``kind``
(the name), implement :meth:`TraceFormat.read`, and decorate it with
``@TRACE_FORMATS.register`` (in a plugin file, or here). Unknown names raise an error that lists
the registered ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar, Literal

from zwcore import Registry

from ._arrivals import PlannedRequest
from ._config import ClientMixEntry, UserGroupConfig

TimeUnit = Literal["ms", "s"]
MOONCAKE_BLOCK_TOKENS = 512


class TraceError(ValueError):
    """A trace file that cannot be read as its format: the message names the file and what is
    wrong (a missing column, a bad line)."""


class TraceFormat:
    """A trace file format, registered in :data:`TRACE_FORMATS` under its ``kind`` class
    attribute and instantiated without arguments each time a trace of it is read."""

    kind: ClassVar[str]

    def read(self, path: Path, time_unit: TimeUnit | None) -> list[PlannedRequest]:
        """Every request of the file at ``path``, in any order, ``offset_s`` in seconds from
        the trace's own zero (``time_unit``, when given, is the unit of numeric timestamps in
        place of the format's own). The caller sorts them, counts offsets from the first and
        raises lengths below 1 to 1.

        Raises :class:`TraceError` naming the file and the problem; ``OSError``,
        ``ValueError``, ``KeyError`` and ``TypeError`` are reported by the caller as "not a
        <kind> trace".
        """
        raise NotImplementedError


TRACE_FORMATS: Registry[TraceFormat] = Registry("trace format")


def _scale(unit: TimeUnit | None, default: TimeUnit) -> float:
    """Seconds per timestamp unit: ``unit``, else the format's ``default``."""
    return 1e-3 if (unit or default) == "ms" else 1.0


@TRACE_FORMATS.register
class Mooncake(TraceFormat):
    """JSON lines ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``
    (Mooncake's traces, github.com/kvcache-ai/Mooncake: ``timestamp`` is in milliseconds from
    the trace's start; each hash id names a block of ``block_tokens`` = 512 prompt tokens, so
    requests whose ``hash_ids`` begin alike get prompts that begin alike)."""

    kind = "mooncake"

    def read(self, path: Path, time_unit: TimeUnit | None) -> list[PlannedRequest]:
        scale = _scale(time_unit, "ms")
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
    """The CSV file at ``path`` as a pandas frame; raises :class:`TraceError` naming the
    ``columns`` (values) it lacks."""
    import pandas as pd

    frame = pd.read_csv(path)
    missing = [c for c in columns.values() if c not in frame]
    if missing:
        raise TraceError(
            f"{path}: missing column {', '.join(map(repr, missing))} "
            f"(found {', '.join(map(repr, frame.columns))})"
        )
    return frame


@TRACE_FORMATS.register
class Azure(TraceFormat):
    """CSV ``TIMESTAMP`` (a date and time), ``ContextTokens``, ``GeneratedTokens`` (the Azure
    LLM inference traces, github.com/Azure/AzurePublicDataset); ``time_unit`` does not apply."""

    kind = "azure"

    def read(self, path: Path, time_unit: TimeUnit | None) -> list[PlannedRequest]:
        import pandas as pd

        cols = {"t": "TIMESTAMP", "prompt": "ContextTokens", "output": "GeneratedTokens"}
        frame = _csv(path, cols)
        stamps = pd.to_datetime(frame[cols["t"]], format="mixed")
        seconds = (stamps - stamps.min()).dt.total_seconds()
        return [
            PlannedRequest(float(t), int(p), int(o))
            for t, p, o in zip(seconds, frame[cols["prompt"]], frame[cols["output"]], strict=True)
        ]


@TRACE_FORMATS.register
class BurstGPT(TraceFormat):
    """CSV ``Timestamp`` (seconds), ``Request tokens``, ``Response tokens``
    (github.com/HPMLL/BurstGPT); rows whose ``Response tokens`` is 0 (failed requests) are
    kept, with one output token."""

    kind = "burstgpt"

    def read(self, path: Path, time_unit: TimeUnit | None) -> list[PlannedRequest]:
        cols = {"t": "Timestamp", "prompt": "Request tokens", "output": "Response tokens"}
        frame = _csv(path, cols)
        scale = _scale(time_unit, "s")
        return [
            PlannedRequest(float(t) * scale, int(p), int(o))
            for t, p, o in zip(
                frame[cols["t"]], frame[cols["prompt"]], frame[cols["output"]], strict=True
            )
        ]


@TRACE_FORMATS.register
class ZerowindowRun(TraceFormat):
    """A past run's ``requests.parquet`` (or its run folder): ``t_scheduled`` (else ``t_send``)
    in monotonic seconds, ``prompt_tokens_requested``, ``max_tokens``, and each request's
    client behaviour (read, action, receive buffer) from that run's ``run.json``: an incident
    replayed against another proxy or engine version. ``time_unit`` does not apply."""

    kind = "zerowindow"

    def read(self, path: Path, time_unit: TimeUnit | None) -> list[PlannedRequest]:
        import pandas as pd

        folder = path if path.is_dir() else path.parent
        requests = pd.read_parquet(folder / "requests.parquet" if path.is_dir() else path)
        behaviours = _run_behaviours(folder / "run.json")
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


def _run_behaviours(run_json: Path) -> dict[tuple[str, str | None], ClientMixEntry]:
    """The client behaviours of a run's groups, by (group, client-mix entry name; ``None``:
    the group's own settings), from its ``run.json``. Raises :class:`TraceError` when the
    file or its groups cannot be read."""
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
    return behaviours
