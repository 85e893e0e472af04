"""OpenAI-compatible streaming: request bodies, and the meaning of each SSE ``data`` payload.

Request shape: OpenAI API reference, "Completions" (``prompt``) and "Chat completions"
(``messages``) with ``stream: true`` and ``stream_options.include_usage``;
``stream_options.continuous_usage_stats`` and ``ignore_eos`` are vLLM extensions
(vllm/entrypoints/openai/protocol.py, ``StreamOptions`` and ``SamplingParams``). With
continuous usage stats every chunk carries the cumulative ``usage.completion_tokens``, so the
difference between consecutive chunks is the number of tokens a chunk carried. The stream ends
with a usage-only chunk (empty ``choices``) and ``data: [DONE]``. vLLM reports a failure in
the middle of a stream as a ``data:`` payload holding an error object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

Endpoint = Literal["completions", "chat"]

ENDPOINT_PATHS: dict[str, str] = {
    "completions": "/v1/completions",
    "chat": "/v1/chat/completions",
}


def request_body(
    *,
    endpoint: Endpoint,
    model: str,
    prompt: str,
    max_tokens: int,
    ignore_eos: bool,
    messages: Sequence[Mapping[str, str]] | None = None,
    min_tokens: bool = False,
    stream: bool = True,
) -> dict[str, Any]:
    """The JSON body of one request: streamed (``stream: true`` with usage in every chunk), or
    with ``stream=False`` answered whole (``stream: false``; OpenAI API reference).

    ``endpoint="completions"`` sends ``prompt``; ``"chat"`` sends ``messages`` (``{"role",
    "content"}`` each, in order: a conversation) when given, else one user message of
    ``prompt``. ``ignore_eos``
    is sent only when true (it is a vLLM extension that other servers may reject), and so is
    ``min_tokens`` (then ``min_tokens = max_tokens``: vLLM's sampling parameter, so the answer
    has ``max_tokens`` tokens on a server that honours it but not ``ignore_eos``). Raises
    ``ValueError`` for an unknown endpoint, or ``messages`` with ``"completions"``.
    """
    body: dict[str, Any] = {"model": model}
    if messages is not None and endpoint != "chat":
        raise ValueError(f"messages are sent to the chat endpoint, not {endpoint!r}")
    if messages is not None:
        body["messages"] = [dict(m) for m in messages]
    elif endpoint == "completions":
        body["prompt"] = prompt
    elif endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        raise ValueError(f"unknown endpoint {endpoint!r}; valid: {sorted(ENDPOINT_PATHS)}")
    body["max_tokens"] = max_tokens
    body["stream"] = stream
    if stream:
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if ignore_eos:
        body["ignore_eos"] = True
    if min_tokens:
        body["min_tokens"] = max_tokens
    return body


PayloadKind = Literal["chunk", "usage", "done", "error"]


class Payload(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one SSE ``data`` payload means.

    ``kind``: ``"chunk"`` (non-empty ``choices``), ``"usage"`` (empty ``choices``: the final
    usage-only chunk, not a token chunk), ``"done"`` (``[DONE]``) or ``"error"`` (an error
    object, malformed JSON, or JSON that is not an object). ``completion_tokens`` and
    ``prompt_tokens`` are the cumulative usage counts when present, else ``None``;
    ``stream_id`` is the payload's ``id`` (the same in every chunk of a stream; vLLM's is
    ``cmpl-<X-Request-Id>``, and its engine's request id begins with it).
    """

    kind: PayloadKind
    text: str = ""
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    stream_id: str | None = None


def _error_text(obj: dict[str, Any]) -> str:
    err = obj.get("error", obj)
    if isinstance(err, dict):
        message = err.get("message", "")
        extra = ", ".join(f"{k}={err[k]}" for k in ("type", "code") if err.get(k) is not None)
        return f"{message} ({extra})" if extra else str(message or err)
    return str(err)


class _Usage(msgspec.Struct):
    completion_tokens: int | None = None
    prompt_tokens: int | None = None


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    text: str | None = None
    delta: _Delta | None = None
    message: _Delta | None = None  # a chat answer sent whole (``stream: false``)
    finish_reason: str | None = None


class _Chunk(msgspec.Struct):
    """The fields of a stream chunk the client uses; the others are skipped unread."""

    id: str | None = None
    object: str | None = None
    choices: list[_Choice] | None = None
    usage: _Usage | None = None
    error: Any = msgspec.UNSET


_CHUNK_DECODER = msgspec.json.Decoder(_Chunk)
_ANY_DECODER = msgspec.json.Decoder()
_DONE = Payload(kind="done")


def parse_payload(data: str | bytes, *, event_type: str = "message") -> Payload:
    """Interpret the data of one SSE event of an OpenAI-compatible stream, or the body of an
    answer sent whole (``stream: false``: its one choice's ``message`` or ``text``, its usage,
    as one chunk). Never raises.

    An event of type ``error``, an object with an ``error`` key, or an object with
    ``"object": "error"`` (older vLLM) is an error; so are malformed JSON and non-objects.
    A chunk of the usual shape is decoded by msgspec into the few fields used; anything else
    (a field of an unexpected type, an error) is read generically with the same meaning.
    """
    if event_type == "message":
        try:
            chunk = _CHUNK_DECODER.decode(data)
        except msgspec.DecodeError:
            pass  # not the usual shape (or not JSON): read generically below
        else:
            if chunk.error is msgspec.UNSET and chunk.object != "error":
                return _from_chunk(chunk)
    return _parse_generic(data, event_type)


UsualChunk = tuple[str, "int | None", "int | None", "str | None", "str | None"]
"""``(text, completion_tokens, prompt_tokens, finish_reason, stream_id)`` of a chunk of the
usual shape, as :class:`Payload` would hold them."""


def usual_chunk(data: bytes) -> UsualChunk | None:
    """The fields of ``data`` (an SSE ``message`` event's data) when it is a token chunk of the
    usual shape (one choice, no error), else None: then :func:`parse_payload` says what it is.
    The client's fast path, one call per event: the same meaning as ``parse_payload``, without
    its :class:`Payload`. Never raises."""
    try:
        chunk = _CHUNK_DECODER.decode(data)
    except msgspec.DecodeError:
        return None
    choices = chunk.choices
    if not choices or len(choices) != 1 or chunk.error is not msgspec.UNSET:
        return None
    if chunk.object == "error":
        return None
    choice = choices[0]
    delta = choice.delta or choice.message
    text = (delta.content if delta is not None else choice.text) or ""
    usage = chunk.usage
    if usage is None:
        return text, None, None, choice.finish_reason, chunk.id
    return text, usage.completion_tokens, usage.prompt_tokens, choice.finish_reason, chunk.id


def _from_chunk(chunk: _Chunk) -> Payload:
    usage = chunk.usage
    completion_tokens = usage.completion_tokens if usage is not None else None
    prompt_tokens = usage.prompt_tokens if usage is not None else None
    if not chunk.choices:
        return Payload(
            kind="usage",
            completion_tokens=completion_tokens,
            prompt_tokens=prompt_tokens,
            stream_id=chunk.id,
        )
    # one choice (n = 1) is read on the client's hot path by usual_chunk; here, any number
    finish_reason = None
    texts: list[str] = []
    for choice in chunk.choices:
        delta = choice.delta or choice.message
        piece = delta.content if delta is not None else choice.text
        if piece is not None:
            texts.append(piece)
        if choice.finish_reason is not None:
            finish_reason = choice.finish_reason
    text = "".join(texts)
    return Payload(
        kind="chunk",
        text=text,
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        finish_reason=finish_reason,
        stream_id=chunk.id,
    )


def _parse_generic(data: str | bytes, event_type: str) -> Payload:
    text = data if isinstance(data, str) else data.decode("utf-8", "replace")
    if text.strip() == "[DONE]":
        return _DONE
    try:
        obj = _ANY_DECODER.decode(data)
    except msgspec.DecodeError as e:
        return Payload(kind="error", error=f"malformed JSON in stream: {e}: {text[:200]!r}")
    if not isinstance(obj, dict):
        return Payload(kind="error", error=f"stream payload is not a JSON object: {text[:200]!r}")
    if event_type == "error" or "error" in obj or obj.get("object") == "error":
        return Payload(kind="error", error=_error_text(obj))
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    completion_tokens = _int_or_none(usage.get("completion_tokens")) if usage else None
    prompt_tokens = _int_or_none(usage.get("prompt_tokens")) if usage else None
    stream_id = obj["id"] if isinstance(obj.get("id"), str) else None
    choices = obj.get("choices")
    if not isinstance(choices, list) or not choices:
        return Payload(
            kind="usage",
            completion_tokens=completion_tokens,
            prompt_tokens=prompt_tokens,
            stream_id=stream_id,
        )
    texts: list[str] = []
    finish_reason: str | None = None
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")  # a chat chunk's, even empty; else a whole chat answer's
        delta = choice.get("message") if delta is None else delta
        piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if isinstance(piece, str):
            texts.append(piece)
        if choice.get("finish_reason") is not None:
            finish_reason = str(choice["finish_reason"])
    return Payload(
        kind="chunk",
        text="".join(texts),
        completion_tokens=completion_tokens,
        prompt_tokens=prompt_tokens,
        finish_reason=finish_reason,
        stream_id=stream_id,
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class TokenCounter:
    """Counts the output tokens each chunk carried.

    A chunk with ``usage.completion_tokens`` carried ``completion_tokens - counted`` tokens
    (never negative), where ``counted`` is the sum so far; a chunk without usage carried 1
    token if its text delta is non-empty, else 0. ``total`` is the last usage total seen
    (including the final usage-only chunk) or, if the server sent no usage, the sum.
    """

    def __init__(self) -> None:
        self.counted = 0
        self.usage_total: int | None = None

    def chunk_tokens(self, payload: Payload) -> int:
        """Tokens carried by ``payload`` (0 for anything but a ``"chunk"``); updates totals."""
        if payload.kind == "chunk":
            return self.count(payload.text, payload.completion_tokens)
        if payload.completion_tokens is not None:
            self.usage_total = payload.completion_tokens
        return 0

    def count(self, text: str, completion_tokens: int | None) -> int:
        """Tokens carried by a token chunk of ``text`` and ``usage.completion_tokens``;
        updates totals."""
        if completion_tokens is None:
            tokens = 1 if text else 0
        else:
            self.usage_total = completion_tokens
            tokens = max(0, completion_tokens - self.counted)
        self.counted += tokens
        return tokens

    @property
    def total(self) -> int:
        return self.usage_total if self.usage_total is not None else self.counted
