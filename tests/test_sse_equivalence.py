"""The bytes-based SSE decoder against the line-at-a-time one it replaces (kept only while
both exist): the same events, field by field, for random streams cut at random places."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from loadgen._sse import SSEDecoder
from loadgen._sse_old import SSEDecoder as OldDecoder

_PIECES = st.sampled_from(
    [
        b"data: ", b"data:", b"data", b"event: ", b"event:x", b"id: ", b"id:\x00", b"retry: ",
        b"retry:12", b":", b": comment", b"x", b" ", b"{\"a\": 1}", b"[DONE]", b"\n", b"\r",
        b"\r\n", b"\n\n", b"\xef\xbb\xbf", b"\xc3", b"\xa9", b"\xe2\x82\xac", b"\xff", b"9",
        b"caf\xc3\xa9",
    ]
)  # fmt: skip
_STREAMS = st.one_of(
    st.lists(_PIECES, max_size=60).map(b"".join),
    st.binary(max_size=300),
)


def _events(decoder: object, stream: bytes, cuts: list[int]) -> list[tuple]:
    out = []
    bounds = [0, *sorted(c % (len(stream) + 1) for c in cuts), len(stream)]
    for a, b in zip(bounds, bounds[1:], strict=False):
        for ev in decoder.feed(stream[a:b]):  # type: ignore[attr-defined]
            out.append((ev.data, ev.event, ev.id, ev.retry_ms, ev.wire_bytes))
    decoder.close()  # type: ignore[attr-defined]
    return out


@settings(max_examples=1500, deadline=None)
@given(stream=_STREAMS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12))
def test_same_events_as_the_line_decoder(stream: bytes, cuts: list[int]) -> None:
    assert _events(SSEDecoder(), stream, cuts) == _events(OldDecoder(), stream, cuts)
