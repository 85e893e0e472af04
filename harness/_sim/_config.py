"""Configuration of the engine emulator (``sim``): one frozen, validated record.

Every knob of the emulator lives here, with its unit in its name. The defaults describe a
small engine in the spirit of the vLLM CPU setup in DESIGN.md (64 KV blocks of 32 tokens,
16 sequences per batch) so that KV pressure and preemption are easy to provoke.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

KvRelease = Literal["on_finish", "on_delivery"]
"""When a finished request's KV blocks return to the pool.

``on_finish``: when its last token is generated (what vLLM does: the engine never waits on
the socket). ``on_delivery``: only once the response's last byte has left the server socket
(the transport's write buffer and the kernel Send-Q are both empty) or the client is gone
(the incident write-up's failure, used as the positive control)."""


class SimConfig(BaseModel):
    """Settings of one emulated engine; frozen, unknown fields are an error.

    Step time model (one engine step = one batch forward pass)::

        step_ms = step_fixed_ms
                + prefill_ms_per_token * prompt tokens (re)computed in this step
                + decode_ms_per_seq * sequences decoding one token in this step

    Raises ``pydantic.ValidationError`` on invalid values, including a ``max_model_len``
    larger than the whole KV cache (``num_blocks * block_size`` tokens): like vLLM, which
    refuses to start when one maximum-length sequence cannot fit, this guarantees that a
    request alone in the engine can always run to completion.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    block_size: int = Field(default=32, ge=1, description="tokens per KV block (page)")
    num_blocks: int = Field(default=64, ge=1, description="KV blocks in the cache")
    kv_bytes_per_token: int = Field(
        default=1024,
        ge=1,
        description="bytes of KV cache one token takes, over all layers: 2 (K and V) x layers "
        "x KV heads x head size x dtype bytes, as vLLM's page size (AttentionSpec in "
        "vllm/v1/kv_cache_interface.py); the default is the tiny model's, 2 x 2 x 2 x 64 x 2 "
        "(bfloat16). A block takes kv_bytes_per_token x block_size bytes",
    )
    max_num_seqs: int = Field(default=16, ge=1, description="sequences per batch at most")
    max_num_batched_tokens: int = Field(
        default=8192,
        ge=1,
        description="tokens per step at most (decode tokens + prefill tokens); a prompt "
        "longer than this is admitted alone (no chunked prefill)",
    )
    max_model_len: int = Field(
        default=2048, ge=2, description="prompt + generated tokens per request at most"
    )
    step_fixed_ms: float = Field(default=4.0, ge=0.0, description="fixed cost of a step, ms")
    prefill_ms_per_token: float = Field(
        default=0.02, ge=0.0, description="cost per prompt token (re)computed in a step, ms"
    )
    decode_ms_per_seq: float = Field(
        default=0.15, ge=0.0, description="cost per sequence decoding in a step, ms"
    )
    enable_prefix_caching: bool = Field(
        default=True,
        description="keep freed full KV blocks findable by their tokens' hash and start a "
        "request from its longest cached prefix of full blocks (vLLM v1's automatic prefix "
        "caching, on by default: CacheConfig.enable_prefix_caching in vllm/config/cache.py); "
        "tokens are the emulator's words and marks, a chat prompt's rendered messages",
    )
    kv_release: KvRelease = Field(
        default="on_finish",
        description="when a finished request's KV blocks are freed: on_finish (vLLM) or "
        "on_delivery (once its response has left the server socket)",
    )
    eos_probability: float = Field(
        default=0.002,
        ge=0.0,
        le=1.0,
        description="chance that a sampled token is EOS (ends the request with "
        "finish_reason 'stop') unless the request sets ignore_eos",
    )
    seed: int = Field(default=0, description="seed of the token text and EOS draws")
    served_model_name: str = Field(
        default="sim", min_length=1, description="model name in /v1/models and metric labels"
    )
    sndbuf_bytes: int | None = Field(
        default=None,
        ge=1024,
        description="SO_SNDBUF of accepted connections in bytes (the kernel doubles it, "
        "socket(7)); None keeps the kernel's autotuning (net.ipv4.tcp_wmem). A small value "
        "makes a stalled client block the stream's ASGI send sooner",
    )
    sse_keep_alive_s: float = Field(
        default=0.0,
        ge=0.0,
        description="send an SSE comment (': keep-alive') whenever a stream has been idle "
        "this long, as vLLM's --sse-keep-alive-interval (while queued, in prefill, between "
        "tokens); 0: never",
    )
    delivery_poll_ms: float = Field(
        default=10.0,
        gt=0.0,
        description="on_delivery only: interval between checks that a finished response "
        "has left the server socket, ms",
    )

    @property
    def kv_block_bytes(self) -> int:
        """Bytes one KV block stands for: ``kv_bytes_per_token`` x ``block_size``."""
        return self.kv_bytes_per_token * self.block_size

    @model_validator(mode="after")
    def _fits(self) -> SimConfig:
        capacity = self.num_blocks * self.block_size
        if self.max_model_len > capacity:
            raise ValueError(
                f"max_model_len={self.max_model_len} exceeds the KV cache "
                f"({self.num_blocks} blocks x {self.block_size} tokens = {capacity} tokens)"
            )
        return self
