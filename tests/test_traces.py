"""Trace replay (``loadgen._traces``): each format is read in its own time unit, a window is
cropped and scaled, shared hash ids give shared prompt prefixes, a file that is not of its
format gets an error naming the file and the line or column, and formats are a registry: an
unknown one is refused at the field with the registered ones listed, a new one is one class
and one registration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from loadgen import (
    ARRIVALS,
    TRACE_FORMATS,
    PlannedRequest,
    TraceArrivals,
    TraceError,
    TraceFormat,
    UserGroupConfig,
    read_trace,
)
from loadgen._prompt import build_prefixed_prompt
from zwcore import UnknownKindError, relocated_errors


def _mooncake(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [
    {"timestamp": 1000, "input_length": 700, "output_length": 10, "hash_ids": [1, 2]},
    {"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 3]},
    {"timestamp": 2500, "input_length": 100, "output_length": 0, "hash_ids": []},
]


def test_mooncake_timestamps_are_milliseconds_unless_told(tmp_path):
    path = _mooncake(tmp_path / "trace.jsonl", ROWS)
    rows = read_trace(path, "mooncake")
    assert [r.offset_s for r in rows] == [0.0, 1.0, 2.5]  # sorted, from the first
    assert [(r.prompt_tokens, r.max_tokens) for r in rows] == [(600, 5), (700, 10), (100, 1)]
    assert rows[0].prefix_blocks == (1, 3)
    assert [r.offset_s for r in read_trace(path, "mooncake", "s")] == [0.0, 1000.0, 2500.0]


def test_a_window_is_cropped_scaled_and_counted(tmp_path):
    path = _mooncake(tmp_path / "trace.jsonl", ROWS)
    arrival = ARRIVALS.parse(
        {"kind": "trace", "format": "mooncake", "path": str(path), "start_s": 0.5,
         "time_scale": 0.5}
    )  # fmt: skip
    plan = arrival.plan(0)
    assert [p.offset_s for p in plan] == [0.0, 0.75]  # 1.0 and 2.5 s, from 1.0, halved
    assert all(p.block_tokens == 512 for p in plan)
    limited = arrival.model_copy(update={"requests": 1, "end_s": 2.0})
    assert [p.max_tokens for p in limited.plan(0)] == [10]


def test_shared_hash_ids_give_shared_prompt_prefixes():
    a = build_prefixed_prompt((1, 2), 4, 10, seed=7).split()
    b = build_prefixed_prompt((1, 3), 4, 10, seed=8).split()
    assert len(a) == len(b) == 10
    assert a[:4] == b[:4] and a[4:8] != b[4:8]  # block 1 shared, then they part
    assert build_prefixed_prompt((1,), 4, 2, seed=0).split() == a[:2]


def test_azure_and_burstgpt_csv(tmp_path):
    azure = tmp_path / "azure.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    rows = read_trace(azure, "azure")
    assert [r.prompt_tokens for r in rows] == [374, 396]
    assert rows[1].offset_s == pytest.approx(4.3145790, abs=1e-6)
    burst = tmp_path / "burst.csv"
    burst.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5.0,ChatGPT,472,18,490,Conversation log\n"
        "45.0,GPT-4,1087,0,1087,Conversation log\n"
    )
    rows = read_trace(burst, "burstgpt")
    assert [(r.offset_s, r.prompt_tokens, r.max_tokens) for r in rows] == [
        (0.0, 472, 18),
        (40.0, 1087, 1),  # a failed request (0 tokens) still asks for one
    ]


def test_bad_traces_name_the_file_and_the_problem(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 5, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(TraceError, match=r"bad.jsonl:2: not a Mooncake record"):
        read_trace(bad, "mooncake")
    csv = tmp_path / "azure.csv"
    csv.write_text("TIMESTAMP,Tokens\n2023-11-16 18:15:46,3\n")
    with pytest.raises(TraceError, match=r"azure.csv: missing column 'ContextTokens'"):
        read_trace(csv, "azure")
    base = {"name": "g", "prompt_tokens": 8, "max_tokens": 8}
    with pytest.raises(ValidationError, match="no trace at"):
        UserGroupConfig(
            **base, arrival={"kind": "trace", "format": "azure", "path": str(tmp_path / "no")}
        )
    with pytest.raises(ValidationError, match="format"):
        UserGroupConfig(**base, arrival={"kind": "trace", "format": "csv", "path": str(csv)})


def test_an_unknown_format_is_refused_at_its_field_with_the_registered_ones(tmp_path):
    trace = _mooncake(tmp_path / "trace.jsonl", ROWS)
    base = {"name": "g", "prompt_tokens": 8, "max_tokens": 8}
    with pytest.raises(ValidationError) as info:
        UserGroupConfig(**base, arrival={"kind": "trace", "format": "jsonl", "path": str(trace)})
    [error] = relocated_errors(info.value)
    assert error["loc"] == ("arrival", "format")
    assert "unknown trace format kind 'jsonl'" in error["msg"]
    assert all(name in error["msg"] for name in ("azure", "burstgpt", "mooncake", "zerowindow"))
    with pytest.raises(UnknownKindError, match="valid kinds: .*mooncake"):
        read_trace(trace, "jsonl")


def test_a_new_format_is_one_class_and_one_registration(tmp_path):
    @TRACE_FORMATS.register
    class Lines(TraceFormat):
        """One request per line: ``offset_s prompt_tokens max_tokens``."""

        kind = "test-lines"

        def read(self, path, time_unit):
            lines = path.read_text().splitlines()
            return [PlannedRequest(float(t), int(p), int(o)) for t, p, o in map(str.split, lines)]

    path = tmp_path / "trace.txt"
    path.write_text("12 5 6\n11 3 0\n")
    arrival = ARRIVALS.parse({"kind": "trace", "format": "test-lines", "path": str(path)})
    planned = [(p.offset_s, p.prompt_tokens, p.max_tokens) for p in arrival.plan(0)]
    assert planned == [(0.0, 3, 1), (1.0, 5, 6)]  # sorted, from the first, at least 1 token
    enum = TraceArrivals.model_json_schema()["properties"]["format"]["enum"]
    assert {"mooncake", "test-lines"} <= set(enum)
