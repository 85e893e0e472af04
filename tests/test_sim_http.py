"""The emulator's HTTP surface against a real uvicorn server on port 0: vLLM's shapes."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from harness._sim import SimConfig, SimServer
from tests.test_sim_helpers import CLIENT, scrape, sse_events, wait_for

FAST = dict(step_fixed_ms=0.5, decode_ms_per_seq=0.01, prefill_ms_per_token=0.001)

# Key order of vLLM 0.32's chunks (pydantic model_dump_json(exclude_unset=True) output).
COMPLETION_CHUNK_KEYS = ["id", "object", "created", "model", "choices"]
COMPLETION_CHOICE_KEYS = [
    "index", "text", "logprobs", "finish_reason", "stop_reason", "prompt_token_ids", "token_ids",
]  # fmt: skip
USAGE_KEYS = ["prompt_tokens", "total_tokens", "completion_tokens"]


@pytest.fixture(scope="module")
def server() -> Iterator[SimServer]:
    with SimServer(SimConfig(num_blocks=256, **FAST)) as srv:
        yield srv


def _stream(srv: SimServer, path: str, body: dict[str, object]) -> list[str]:
    with CLIENT.stream("POST", srv.url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        return sse_events(r.read().decode())


def test_completion_stream_continuous_usage(server: SimServer) -> None:
    events = _stream(
        server,
        "/v1/completions",
        {
            "model": "sim", "prompt": "one two three", "max_tokens": 50, "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )  # fmt: skip
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *token_chunks, usage_chunk = chunks
    seen = 0
    for i, c in enumerate(token_chunks):
        assert list(c) == COMPLETION_CHUNK_KEYS + ["usage"]
        assert c["object"] == "text_completion" and c["model"] == "sim"
        assert c["id"].startswith("cmpl-") and c["id"] == chunks[0]["id"]
        (choice,) = c["choices"]
        assert list(choice) == COMPLETION_CHOICE_KEYS
        seen += len(choice["text"].split())
        assert list(c["usage"]) == USAGE_KEYS
        assert c["usage"]["completion_tokens"] == seen  # cumulative
        assert c["usage"]["prompt_tokens"] == 3
        assert c["usage"]["total_tokens"] == 3 + seen
        last = i == len(token_chunks) - 1
        assert choice["finish_reason"] == ("length" if last else None)
    assert seen == 50
    assert usage_chunk["choices"] == [] and list(usage_chunk) == COMPLETION_CHUNK_KEYS + ["usage"]
    assert usage_chunk["usage"] == {"prompt_tokens": 3, "total_tokens": 53, "completion_tokens": 50}


def test_completion_stream_without_usage(server: SimServer) -> None:
    events = _stream(
        server,
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 20, "ignore_eos": True, "stream": True},
    )
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(len(c["choices"][0]["text"].split()) for c in chunks) == 20


def test_include_usage_only_final_chunk(server: SimServer) -> None:
    events = _stream(
        server,
        "/v1/completions",
        {"prompt": "hi", "max_tokens": 5, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True}},
    )  # fmt: skip
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5


def test_chat_stream_shape(server: SimServer) -> None:
    events = _stream(
        server,
        "/v1/chat/completions",
        {
            "model": "sim", "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": 8, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )  # fmt: skip
    assert events[-1] == "[DONE]"
    role, *tokens, usage = [json.loads(e) for e in events[:-1]]
    assert role["object"] == "chat.completion.chunk" and role["id"].startswith("chatcmpl-")
    assert role["choices"] == [
        {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
         "finish_reason": None}
    ]  # fmt: skip
    assert list(role) == COMPLETION_CHUNK_KEYS + ["usage", "prompt_token_ids", "prompt_text"]
    assert role["usage"]["completion_tokens"] == 0
    assert role["usage"]["completion_tokens_details"] is None
    n = 0
    for c in tokens:
        (choice,) = c["choices"]
        n += len(choice["delta"]["content"].split())
        assert c["usage"]["completion_tokens"] == n
        if choice["finish_reason"] is None:
            assert list(choice) == ["index", "delta", "logprobs", "finish_reason", "token_ids"]
    assert tokens[-1]["choices"][0]["finish_reason"] == "length"
    assert tokens[-1]["choices"][0]["stop_reason"] is None
    assert n == 8
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 8
    assert "completion_tokens_details" not in usage["usage"]


def test_non_streaming_completion_and_chat(server: SimServer) -> None:
    r = CLIENT.post(
        server.url + "/v1/completions",
        json={"prompt": "a b c d", "max_tokens": 7, "ignore_eos": True},
        timeout=30,
    )
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 7
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {
        "prompt_tokens": 4, "total_tokens": 11, "completion_tokens": 7,
        "prompt_tokens_details": None, "completion_tokens_details": None,
    }  # fmt: skip
    r = CLIENT.post(
        server.url + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 4,
              "ignore_eos": True},
        timeout=30,
    )  # fmt: skip
    body = r.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert len(body["choices"][0]["message"]["content"].split()) == 4
    assert body["usage"]["completion_tokens"] == 4


def test_same_prompt_same_text(server: SimServer) -> None:
    def text(prompt: str) -> str:
        r = CLIENT.post(
            server.url + "/v1/completions",
            json={"prompt": prompt, "max_tokens": 12, "ignore_eos": True},
            timeout=30,
        )
        return str(r.json()["choices"][0]["text"])

    assert text("tell me") == text("tell me") != text("tell you")


def test_models_health_and_metrics(server: SimServer) -> None:
    assert CLIENT.get(server.url + "/health").status_code == 200
    models = CLIENT.get(server.url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["id"] == "sim" and models["data"][0]["owned_by"] == "vllm"
    CLIENT.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 3})
    m = scrape(server.url)
    for name in (
        "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds_count",
        "vllm:inter_token_latency_seconds_count", "vllm:generation_tokens_total",
        "vllm:request_success_total:length", "vllm:request_success_total:abort",
    ):  # fmt: skip
        assert name in m, name
    assert m["vllm:time_to_first_token_seconds_count"] >= 1
    assert m["vllm:request_success_total:length"] + m["vllm:request_success_total:stop"] >= 1
    text = CLIENT.get(server.url + "/metrics").text
    assert 'vllm:kv_cache_usage_perc{engine="0",model_name="sim"}' in text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "other", "prompt": "x"}, 404),
        ({"prompt": list(range(2048)), "max_tokens": 1}, 400),
        ({"prompt": "x", "max_tokens": 0}, 400),
        ({"prompt": "x", "stream_options": {"include_usage": True}}, 400),
        ({"prompt": "x", "n": 2}, 400),
        ({"prompt": ["a", "b"]}, 400),
    ],
)
def test_rejects_like_vllm(server: SimServer, body: dict[str, object], status: int) -> None:
    r = CLIENT.post(server.url + "/v1/completions", json=body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["code"] == status and error["message"]


def test_max_tokens_defaults_and_cap(server: SimServer) -> None:
    r = CLIENT.post(server.url + "/v1/completions", json={"prompt": "x", "ignore_eos": True})
    assert r.json()["usage"]["completion_tokens"] == 16  # vLLM's CompletionRequest default
    r = CLIENT.post(
        server.url + "/v1/completions",
        json={"prompt": list(range(2040)), "max_tokens": 5000, "ignore_eos": True},
    )
    assert r.json()["usage"]["completion_tokens"] == 8  # capped by max_model_len=2048


def test_invalid_json_is_400(server: SimServer) -> None:
    r = CLIENT.post(server.url + "/v1/completions", content=b"{nope")
    assert r.status_code == 400


def test_eos_ends_with_stop_unless_ignored() -> None:
    with SimServer(SimConfig(eos_probability=0.5, **FAST)) as srv:
        r = CLIENT.post(srv.url + "/v1/completions", json={"prompt": "x", "max_tokens": 200})
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert r.json()["usage"]["completion_tokens"] < 200
        r = CLIENT.post(
            srv.url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 200, "ignore_eos": True},
        )
        assert r.json()["choices"][0]["finish_reason"] == "length"
        assert r.json()["usage"]["completion_tokens"] == 200
        assert scrape(srv.url)["vllm:request_success_total:stop"] == 1


@pytest.mark.parametrize("kv_release", ["on_finish", "on_delivery"])
def test_client_disconnect_aborts_and_frees(kv_release: str) -> None:
    cfg = SimConfig(kv_release=kv_release, step_fixed_ms=5.0)
    with SimServer(cfg) as srv:
        with CLIENT.stream(
            "POST",
            srv.url + "/v1/completions",
            json={"prompt": "x", "max_tokens": 1000, "ignore_eos": True, "stream": True},
            timeout=30,
        ) as r:
            chunks = r.iter_raw()  # keep the iterator: dropping it closes the response
            assert next(chunks).startswith(b"data: ")
            assert scrape(srv.url)["vllm:kv_cache_usage_perc"] > 0
        wait_for(
            lambda: scrape(srv.url)["vllm:request_success_total:abort"] == 1,
            timeout_s=5,
            what="abort counted",
        )
        m = scrape(srv.url)
        assert m["vllm:kv_cache_usage_perc"] == 0
        assert m["vllm:num_requests_running"] == 0
        assert m["vllm:request_success_total:length"] == 0


def test_non_streaming_disconnect_aborts() -> None:
    with SimServer(SimConfig(step_fixed_ms=5.0)) as srv:
        with pytest.raises(httpx.ReadTimeout):
            CLIENT.post(
                srv.url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 1000, "ignore_eos": True},
                timeout=0.3,
            )
        wait_for(
            lambda: scrape(srv.url)["vllm:request_success_total:abort"] == 1,
            timeout_s=5,
            what="abort counted",
        )
        assert scrape(srv.url)["vllm:kv_cache_usage_perc"] == 0
