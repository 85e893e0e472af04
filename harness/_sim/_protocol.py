"""OpenAI-compatible request parsing and response shapes, byte for byte as vLLM sends them.

Shapes are copied from vLLM 0.32: streaming chunks from
``vllm/entrypoints/openai/completion/serving.py`` (``completion_stream_generator``) and
``vllm/entrypoints/openai/chat_completion/serving.py`` (``chat_completion_stream_generator``),
which serialize with ``model_dump_json(exclude_unset=True)``; non-streaming bodies from the
same files' full generators, returned as ``JSONResponse(content=response.model_dump())``;
``/v1/models`` from ``vllm/entrypoints/openai/models/serving.py``. The JSON below was
checked against those pydantic models' own output. Chunks are built from string templates
because the emulator must serve tens of thousands of them per second.

Token counting stands in for a tokenizer: a prompt has one token per word or punctuation
mark (at least one); a chat prompt adds 4 tokens per message and 3 for the generation
prompt, roughly what chat templates add. A list of token ids counts its length. The tokens
themselves (``GenerationParams.prompt_tokens``: the words and marks, a chat message rendered
as ``<|start|> role <|sep|> words <|end|>`` and the generation prompt as ``<|start|>
assistant <|sep|>``, token ids as ints) are what the prefix cache hashes.

Request ids follow vLLM 0.32 too (``stream_id``, ``engine_request_id``), so that the engine
tables' ``engine_request_id`` begins with the stream's ``id`` as it does for vLLM.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from dataclasses import dataclass
from typing import Any

from harness._sim._config import SimConfig
from harness._sim._scheduler import VOCAB

_WORD = re.compile(r"\w+|[^\w\s]")
_TOKEN_TEXT: tuple[str, ...] = tuple(" " + w for w in VOCAB) + ("",)  # EOS has no text
DONE = b"data: [DONE]\n\n"


class RequestError(Exception):
    """A request vLLM would reject; ``status`` is the HTTP status, ``kind`` the error type."""

    def __init__(self, message: str, *, status: int = 400, kind: str = "BadRequestError",
                 param: str | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.message = message
        self.status = status
        self.kind = kind
        self.param = param

    def body(self) -> dict[str, Any]:
        """vLLM's ``ErrorResponse`` (``vllm/entrypoints/serve/engine/protocol.py``)."""
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status,
            }
        }


@dataclass(frozen=True, slots=True)
class GenerationParams:
    """What the engine and the renderer need from one request (token counts in tokens)."""

    chat: bool
    prompt_len: int
    max_tokens: int
    ignore_eos: bool
    stream: bool
    include_usage: bool
    continuous_usage: bool
    seed: int
    request_id: str | None = None  # the body's ``request_id`` field, if any
    min_tokens: int = 0  # vLLM's sampling parameter: no EOS before this many tokens
    prompt_tokens: tuple[str | int, ...] = ()  # prompt_len of them (the module docstring)


def token_text(token_ids: list[int]) -> str:
    """Text of token ids (each word with a leading space; EOS is empty)."""
    texts = _TOKEN_TEXT
    if len(token_ids) == 1:
        return texts[token_ids[0]]
    return "".join([texts[t] for t in token_ids])


def _text_tokens(text: str) -> list[str | int]:
    """The emulated tokens of a completion prompt: its words and marks, at least one."""
    return list(_WORD.findall(text)) or [""]


def _prompt_tokens(body: dict[str, Any]) -> tuple[list[str | int], str]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return _text_tokens(prompt), prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return list(prompt), json.dumps(prompt)
        if len(prompt) == 1:
            first = prompt[0]
            if isinstance(first, str):
                return _text_tokens(first), first
            if isinstance(first, list) and first and all(isinstance(t, int) for t in first):
                return list(first), json.dumps(first)
        raise RequestError("the sim engine serves one prompt per request", param="prompt")
    raise RequestError("prompt must be a string or a list of token ids", param="prompt")


def _chat_prompt_tokens(body: dict[str, Any]) -> tuple[list[str | int], str]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    tokens: list[str | int] = []
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise RequestError("each message must be an object", param="messages")
        content = message.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        text = "" if content is None else str(content)
        role = str(message.get("role"))
        tokens += ["<|start|>", role, "<|sep|>", *_WORD.findall(text), "<|end|>"]
        parts.append(f"{role}:{text}")
    tokens += ["<|start|>", "assistant", "<|sep|>"]
    return tokens, "\n".join(parts)


def parse_request(body: Any, config: SimConfig, *, chat: bool) -> GenerationParams:
    """Validate a ``/v1/completions`` (``chat=False``) or ``/v1/chat/completions`` body.

    Raises ``RequestError`` (HTTP 400, or 404 for an unknown model) where vLLM would
    reject the request: wrong model, ``n`` other than 1, several prompts,
    ``stream_options`` without ``stream``, a prompt as long as ``max_model_len``.
    ``max_tokens`` follows vLLM 0.32: 16 by default for completions, unlimited for chat,
    always capped by what ``max_model_len`` leaves after the prompt
    (``get_max_tokens`` in ``vllm/entrypoints/serve/utils/api_utils.py``).
    The per-request seed mixes the server seed, the prompt and the request's ``seed``
    field, so one prompt always yields the same text (like greedy decoding).
    """
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != config.served_model_name:
        raise RequestError(
            f"The model `{model}` does not exist.", status=404, kind="NotFoundError",
            param="model",
        )  # fmt: skip
    n = body.get("n", 1)
    if n not in (1, None):
        raise RequestError("the sim engine supports n=1 only", param="n")
    tokens, prompt_key = _chat_prompt_tokens(body) if chat else _prompt_tokens(body)
    prompt_len = len(tokens)
    limit = config.max_model_len
    if prompt_len >= limit:
        raise RequestError(
            f"Input length ({prompt_len}) exceeds model's maximum context length ({limit}).",
            param="prompt",
        )
    if chat:
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = body.get("max_tokens")
    else:
        max_tokens = body.get("max_tokens", 16)  # CompletionRequest's default
    if max_tokens is not None and (
        not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1
    ):
        raise RequestError("max_tokens must be a positive integer", param="max_tokens")
    # vLLM's get_max_tokens: the request's value capped by what the context has left.
    room = limit - prompt_len
    max_tokens = room if max_tokens is None else min(max_tokens, room)
    stream = bool(body.get("stream", False))
    options = body.get("stream_options")
    include_usage = continuous = False
    if options is not None:
        if not stream:
            raise RequestError(
                "Stream options can only be defined when `stream=True`.",
                param="stream_options",
            )
        if not isinstance(options, dict):
            raise RequestError("stream_options must be an object", param="stream_options")
        include_usage = bool(options.get("include_usage"))
        continuous = include_usage and bool(options.get("continuous_usage_stats"))

    request_id = body.get("request_id")
    if request_id is not None and not isinstance(request_id, str):
        raise RequestError("request_id must be a string", param="request_id")
    min_tokens = body.get("min_tokens", 0)
    if not isinstance(min_tokens, int) or isinstance(min_tokens, bool) or min_tokens < 0:
        raise RequestError("min_tokens must be a non-negative integer", param="min_tokens")

    material = f"{config.seed}\0{body.get('seed')}\0{prompt_key}".encode()
    seed = int.from_bytes(hashlib.blake2b(material, digest_size=8).digest(), "big")
    return GenerationParams(
        chat=chat,
        prompt_len=prompt_len,
        max_tokens=max_tokens,
        ignore_eos=bool(body.get("ignore_eos", False)),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        seed=seed,
        request_id=request_id,
        min_tokens=min_tokens,
        prompt_tokens=tuple(tokens),
    )


def stream_id(params: GenerationParams, x_request_id: str | None) -> str:
    """The ``id`` of a response (every chunk of a stream), as vLLM 0.32 builds it.

    ``cmpl-`` (``chatcmpl-`` for chat) followed by the ``X-Request-Id`` header when the
    request has one, else the body's ``request_id``, else 16 random hex digits
    (``OpenAIServing._base_request_id``, ``vllm/entrypoints/serve/engine/serving.py``;
    ``vllm.utils.random_uuid``).
    """
    base = x_request_id if x_request_id is not None else params.request_id
    if base is None:
        base = secrets.token_hex(8)
    return ("chatcmpl-" if params.chat else "cmpl-") + base


def engine_request_id(stream: str, *, chat: bool) -> str:
    """The engine's internal id of the request whose response id is ``stream``.

    As in vLLM 0.32: a completion's one prompt is sub-request ``<id>-0``
    (``vllm/entrypoints/openai/completion/serving.py``), a chat request keeps ``<id>``
    (``chat_completion/serving.py``), and the engine appends ``-`` and 8 random hex digits
    (``InputProcessor.assign_request_id``, ``vllm/v1/engine/input_processor.py``): e.g.
    ``cmpl-b701d3b175495128-0-a25ce061`` for the stream ``cmpl-b701d3b175495128`` and
    ``chatcmpl-b701d3b175495128-5f0c1e2a`` for the stream ``chatcmpl-b701d3b175495128``.
    """
    sub = stream if chat else stream + "-0"
    return f"{sub}-{secrets.token_hex(4)}"


def _dumps(obj: Any) -> str:
    # Starlette's JSONResponse.render: compact, UTF-8.
    return json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


class Renderer:
    """Builds the SSE events and JSON bodies of one response (vLLM's shapes).

    Event methods return complete ``data: ...\\n\\n`` events as bytes; token counts are in
    tokens.
    """

    __slots__ = ("params", "request_id", "_head", "_chat", "_p", "_model", "_created")

    def __init__(self, params: GenerationParams, model: str, request_id: str) -> None:
        self.params = params
        self._chat = params.chat
        self._p = params.prompt_len
        self._model = model
        self.request_id = request_id  # the response's id (``stream_id``)
        created = self._created = int(time.time())
        obj = "chat.completion.chunk" if params.chat else "text_completion"
        self._head = (
            f'data: {{"id":{_dumps(request_id)},"object":"{obj}","created":{created},'
            f'"model":{_dumps(model)},"choices":'
        )

    def _usage(self, completion_tokens: int, details: bool) -> str:
        p = self._p
        tail = ',"completion_tokens_details":null' if details else ""
        return (
            f'"usage":{{"prompt_tokens":{p},"total_tokens":{p + completion_tokens},'
            f'"completion_tokens":{completion_tokens}{tail}}}'
        )

    def role_event(self) -> bytes:
        """Chat only: the first event, carrying the assistant role and empty content."""
        usage = "," + self._usage(0, True) if self.params.continuous_usage else ""
        return (
            f'{self._head}[{{"index":0,"delta":{{"role":"assistant","content":""}},'
            f'"logprobs":null,"finish_reason":null}}]{usage},'
            f'"prompt_token_ids":null,"prompt_text":null}}\n\n'
        ).encode()

    def token_event(self, text: str, completion_tokens: int, finish_reason: str | None) -> bytes:
        """An event with new text; ``completion_tokens`` is cumulative (continuous usage)."""
        reason = "null" if finish_reason is None else f'"{finish_reason}"'
        quoted = f'"{text}"'  # token texts are ASCII letters and spaces: nothing to escape
        if self._chat:
            stop = ',"stop_reason":null' if finish_reason is not None else ""
            choice = (
                f'{{"index":0,"delta":{{"content":{quoted}}},"logprobs":null,'
                f'"finish_reason":{reason}{stop},"token_ids":null}}'
            )
        else:
            choice = (
                f'{{"index":0,"text":{quoted},"logprobs":null,'
                f'"finish_reason":{reason},"stop_reason":null,"prompt_token_ids":null,'
                f'"token_ids":null}}'
            )
        if self.params.continuous_usage:
            usage = "," + self._usage(completion_tokens, self._chat)
            return f"{self._head}[{choice}]{usage}}}\n\n".encode()
        return f"{self._head}[{choice}]}}\n\n".encode()

    def usage_event(self, completion_tokens: int) -> bytes:
        """The final usage-only event (empty ``choices``), sent when include_usage is set."""
        return f"{self._head}[],{self._usage(completion_tokens, False)}}}\n\n".encode()

    def full_body(self, text: str, completion_tokens: int, finish_reason: str) -> bytes:
        """The non-streaming response body (JSON)."""
        p = self._p
        usage = {
            "prompt_tokens": p,
            "total_tokens": p + completion_tokens,
            "completion_tokens": completion_tokens,
            "prompt_tokens_details": None,
            "completion_tokens_details": None,
        }
        created = self._created
        if self._chat:
            body: dict[str, Any] = {
                "id": self.request_id,
                "object": "chat.completion",
                "created": created,
                "model": self._model,
                "choices": [
                    {
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": text,
                            "refusal": None,
                            "annotations": None,
                            "audio": None,
                            "function_call": None,
                            "reasoning": None,
                        },
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "prompt_logprobs": None,
                "prompt_token_ids": None,
                "prompt_text": None,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        else:
            body = {
                "id": self.request_id,
                "object": "text_completion",
                "created": created,
                "model": self._model,
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": None,
                        "token_ids": None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": None,
                        "routed_experts": None,
                    }
                ],
                "service_tier": None,
                "system_fingerprint": None,
                "usage": usage,
                "kv_transfer_params": None,
                "ec_transfer_params": None,
                "metrics": None,
            }
        return _dumps(body).encode()


def models_body(config: SimConfig) -> bytes:
    """The ``/v1/models`` body: one model card, vLLM's ``ModelList`` shape."""
    created = int(time.time())
    name = config.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": name,
        "parent": None,
        "max_model_len": config.max_model_len,
        "permission": [
            {
                "id": "modelperm-" + secrets.token_hex(8),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return _dumps({"object": "list", "data": [card]}).encode()
