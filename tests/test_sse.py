"""The SSE decoder (WHATWG HTML §9.2) and the OpenAI payload interpretation on top of it."""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from loadgen import SSEDecoder, SSEEvent, TokenCounter, parse_payload, request_body
from loadgen._openai import _parse_generic, usual_chunk


def decode(*reads: bytes) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for chunk in reads:
        events += decoder.feed(chunk)
    decoder.close()
    return events


def datas(events: list[SSEEvent]) -> list[str]:
    return [e.data for e in events]


SAMPLE = (
    b": keep-alive comment\r\n"
    b'data: {"a": 1}\r\n'
    b"\r\n"
    b"event: update\n"
    b"id: 42\n"
    b"data: first line\n"
    b"data:second line\n"
    b"\n"
    b"data: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\r"
    b"\r"
    b"data: [DONE]\n"
    b"\n"
)
SAMPLE_EXPECTED = [
    ("message", "", '{"a": 1}'),
    ("update", "42", "first line\nsecond line"),
    ("message", "42", "caf\u00e9 \u20ac \U0001f600"),
    ("message", "42", "[DONE]"),
]


def summary(events: list[SSEEvent]) -> list[tuple[str, str, str]]:
    return [(e.event, e.id, e.data) for e in events]


def test_sample_in_one_read() -> None:
    events = decode(SAMPLE)
    assert summary(events) == SAMPLE_EXPECTED
    assert sum(e.wire_bytes for e in events) == len(SAMPLE)


@pytest.mark.parametrize("split", range(1, len(SAMPLE)))
def test_sample_split_at_every_byte(split: int) -> None:
    events = decode(SAMPLE[:split], SAMPLE[split:])
    assert summary(events) == SAMPLE_EXPECTED
    # A CRLF split across reads counts its LF towards the next event; the total is exact.
    assert sum(e.wire_bytes for e in events) == len(SAMPLE)


def test_sample_one_byte_per_read() -> None:
    events = decode(*(SAMPLE[i : i + 1] for i in range(len(SAMPLE))))
    assert summary(events) == SAMPLE_EXPECTED


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
def test_line_endings(eol: bytes) -> None:
    stream = eol.join([b"data: x", b"", b"data: y", b"data: z", b"", b""])
    assert datas(decode(stream)) == ["x", "y\nz"]


def test_cr_at_end_of_read_then_lf_is_one_line_end() -> None:
    # Were the LF a second line end, it would be an empty line dispatching a second event.
    events = decode(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n")
    assert datas(events) == ["a\nb"]


def test_lone_cr_then_data_in_next_read() -> None:
    assert datas(decode(b"data: a\r", b"data: b\r\r")) == ["a\nb"]


def test_comments_are_ignored() -> None:
    assert datas(decode(b":comment\n: another\ndata: x\n:inside\n\n:\n\n")) == ["x"]


def test_only_one_leading_space_is_stripped() -> None:
    assert datas(decode(b"data:  two spaces\n\ndata:none\n\n")) == [" two spaces", "none"]


def test_field_without_colon_has_empty_value() -> None:
    # "data" alone appends an empty line to the data buffer: the event is dispatched, empty.
    assert datas(decode(b"data\n\n")) == [""]
    assert datas(decode(b"data\ndata\n\n")) == ["\n"]


def test_event_and_id_fields() -> None:
    events = decode(b"event: add\nid: 7\ndata: 1\n\ndata: 2\n\nid\ndata: 3\n\n")
    assert [(e.event, e.id) for e in events] == [("add", "7"), ("message", "7"), ("message", "")]


def test_id_with_nul_is_ignored_and_retry_needs_digits() -> None:
    events = decode(b"id: 1\ndata: a\n\nid: 2\x003\nretry: 1x\ndata: b\n\nretry: 1500\ndata: c\n\n")
    assert [(e.id, e.retry_ms) for e in events] == [("1", None), ("1", None), ("1", 1500)]


def test_unknown_fields_ignored_and_empty_data_not_dispatched() -> None:
    assert datas(decode(b"foo: bar\n\nevent: x\n\ndata: y\n\n")) == ["y"]


def test_event_type_resets_after_dispatch() -> None:
    events = decode(b"event: x\n\ndata: y\n\n")  # the first block has no data: nothing fires
    assert [(e.event, e.data) for e in events] == [("message", "y")]


def test_incomplete_event_at_end_is_discarded() -> None:
    assert datas(decode(b"data: a\n\ndata: b\n")) == ["a"]


@pytest.mark.parametrize("split", range(1, 4))
def test_bom_is_skipped_even_when_split(split: int) -> None:
    stream = b"\xef\xbb\xbfdata: x\n\n"
    events = decode(stream[:split], stream[split:])
    assert datas(events) == ["x"]
    assert events[0].wire_bytes == len(stream)


def test_utf8_split_inside_a_code_point() -> None:
    stream = "data: \U0001f600\u00e9\n\n".encode()
    for split in range(6, 12):
        assert datas(decode(stream[:split], stream[split:])) == ["\U0001f600\u00e9"]


def test_invalid_utf8_is_replaced() -> None:
    assert datas(decode(b"data: a\xffb\n\n")) == ["a\ufffdb"]


def test_feed_after_close_raises() -> None:
    decoder = SSEDecoder()
    decoder.close()
    with pytest.raises(RuntimeError):
        decoder.feed(b"data: x\n\n")


# --- OpenAI payloads -------------------------------------------------------------------------


def chunk(text: str, completion_tokens: int | None = None, finish: str | None = None) -> str:
    obj: dict[str, object] = {
        "object": "text_completion",
        "choices": [{"index": 0, "text": text, "finish_reason": finish}],
    }
    if completion_tokens is not None:
        obj["usage"] = {"prompt_tokens": 5, "completion_tokens": completion_tokens}
    return json.dumps(obj)


def test_completion_chunk_with_usage() -> None:
    p = parse_payload(chunk(" hi", 3, "length"))
    assert (p.kind, p.text, p.completion_tokens, p.prompt_tokens) == ("chunk", " hi", 3, 5)
    assert p.finish_reason == "length"


def test_chat_chunk_delta() -> None:
    data = json.dumps({"choices": [{"index": 0, "delta": {"content": "yo"}}]})
    assert parse_payload(data).text == "yo"
    role_only = json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    assert parse_payload(role_only).text == ""


def test_usage_only_chunk_and_done() -> None:
    usage = json.dumps({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9}})
    assert parse_payload(usage).kind == "usage"
    assert parse_payload("[DONE]").kind == "done"


@pytest.mark.parametrize(
    "data",
    [
        json.dumps({"error": {"message": "boom", "type": "InternalServerError", "code": 500}}),
        json.dumps({"object": "error", "message": "boom", "type": "X", "code": 400}),
    ],
)
def test_error_payload(data: str) -> None:
    p = parse_payload(data)
    assert p.kind == "error"
    assert p.error is not None and "boom" in p.error


@pytest.mark.parametrize("data", ['{"choices": [', "not json", "[1, 2]"])
def test_malformed_payload_is_an_error_not_a_crash(data: str) -> None:
    p = parse_payload(data)
    assert p.kind == "error" and p.error


def test_error_event_type() -> None:
    assert parse_payload('{"message": "x"}', event_type="error").kind == "error"


def test_token_counter_uses_usage_deltas() -> None:
    counter = TokenCounter()
    got = [counter.chunk_tokens(parse_payload(chunk("a", n))) for n in (1, 4, 5)]
    assert got == [1, 3, 1]
    usage = json.dumps({"choices": [], "usage": {"completion_tokens": 5}})
    assert counter.chunk_tokens(parse_payload(usage)) == 0  # not a token chunk
    assert counter.total == 5


def test_token_counter_falls_back_to_one_per_text_delta() -> None:
    counter = TokenCounter()
    got = [counter.chunk_tokens(parse_payload(chunk(t))) for t in ("a", "", "b")]
    assert got == [1, 0, 1]
    assert counter.total == 2


def test_request_body_shapes() -> None:
    body = request_body(endpoint="chat", model="m", prompt="p", max_tokens=3, ignore_eos=True)
    assert body["messages"] == [{"role": "user", "content": "p"}]
    assert body["stream"] is True and body["ignore_eos"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    body = request_body(
        endpoint="completions", model="m", prompt="p", max_tokens=3, ignore_eos=False
    )
    assert body["prompt"] == "p" and "ignore_eos" not in body and "min_tokens" not in body
    body = request_body(
        endpoint="completions", model="m", prompt="p", max_tokens=3, ignore_eos=False,
        min_tokens=True,
    )  # fmt: skip
    assert body["min_tokens"] == 3


_JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 9) | st.floats(0, 3) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=6,
)


def _maybe(value: st.SearchStrategy) -> st.SearchStrategy:
    return st.one_of(value, _JSON_VALUES)


_CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "text": _maybe(st.text(max_size=4)),
        "delta": _maybe(
            st.fixed_dictionaries({}, optional={"content": _maybe(st.text(max_size=4))})
        ),
        "finish_reason": _maybe(st.sampled_from(["length", "stop"])),
    },
)
_CHUNK = st.fixed_dictionaries(
    {},
    optional={
        "id": _maybe(st.just("cmpl-x")),
        "object": _maybe(st.sampled_from(["text_completion", "error"])),
        "choices": _maybe(st.lists(_maybe(_CHOICE), max_size=2)),
        "usage": _maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "completion_tokens": _maybe(st.integers(0, 9)),
                    "prompt_tokens": _maybe(st.integers(0, 9)),
                },
            )
        ),
        "error": _JSON_VALUES,
    },
)


@settings(max_examples=500, deadline=None)
@given(obj=_CHUNK)
@example(obj={"choices": [{"text": "0", "delta": {}}]})  # found by a fresh clone's run
def test_typed_chunk_decoding_means_what_the_generic_reading_means(obj: dict) -> None:
    data = json.dumps(obj).encode()
    assert parse_payload(data) == _parse_generic(data, "message")
    assert parse_payload(data) == parse_payload(data.decode())


@settings(max_examples=500, deadline=None)
@given(obj=_CHUNK)
def test_usual_chunk_means_what_parse_payload_means(obj: dict) -> None:
    data = json.dumps(obj).encode()
    fields = usual_chunk(data)
    if fields is None:
        return
    p = parse_payload(data)
    assert p.kind == "chunk"
    assert fields == (p.text, p.completion_tokens, p.prompt_tokens, p.finish_reason, p.stream_id)


_LF_LINES = st.sampled_from(
    [b'data: {"n": 1}', b"data: two", b"data:x", b"data", b": comment", b"id: 7", b"event: e",
     b"retry: 5", b"", b"data: [DONE]"]
)  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(_LF_LINES, max_size=30), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_reads_of_many_events_decode_as_byte_by_byte(lines: list[bytes], cuts: list[int]) -> None:
    """Reads holding several events (the whole-read path) mean what one byte per read means."""
    stream = b"".join(line + b"\n" for line in lines)
    bounds = sorted({0, len(stream), *(c for c in cuts if c < len(stream))})
    reads = [stream[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    one_by_one = decode(*(stream[i : i + 1] for i in range(len(stream))))
    assert decode(*reads) == one_by_one
