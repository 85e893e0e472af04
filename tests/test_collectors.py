"""Parsing of the engines' Prometheus exposition (vLLM, llama-server, the llama-cpp-python
probe), llama-server's /slots and the engine process's figures."""

from harness.collectors._collectors import parse_vllm_metrics

TEXT = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 7.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="tiny"} 1.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="tiny"} 4.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="tiny"} 0.9
"""


def test_parse_vllm_metrics_extracts_figures():
    m = parse_vllm_metrics(TEXT)
    assert m["kv_cache_usage"] == 0.25
    assert m["num_requests_running"] == 3.0
    assert m["num_preemptions_total"] == 7.0
    assert m["request_success_length"] == 4.0 and m["request_success_stop"] == 1.0
    assert m["ttft_seconds_count"] == 5.0 and m["ttft_seconds_sum"] == 0.9
    assert "num_requests_waiting" not in m  # missing, not fatal


def test_older_gpu_cache_name_is_accepted():
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.5\n"
    assert parse_vllm_metrics(text)["kv_cache_usage"] == 0.5


# llama-server's /metrics with --metrics (llama.cpp tools/server), as it answered here.
LLAMA_SERVER_TEXT = """# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 112
# HELP llamacpp:requests_processing Number of requests processing.
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 4
# HELP llamacpp:requests_deferred Number of requests deferred.
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 1
"""


def test_llama_server_metrics_fill_the_same_figures():
    m = parse_vllm_metrics(LLAMA_SERVER_TEXT)
    assert m["num_requests_running"] == 4.0
    assert m["num_requests_waiting"] == 1.0
    assert m["generation_tokens_total"] == 112.0
    assert "kv_cache_usage" not in m  # llama-server has none: /slots gives it


def test_slot_figures_count_busy_slots_as_kv_usage():
    from harness.collectors._collectors import slot_figures

    slots = [{"id": i, "is_processing": i < 3} for i in range(8)]
    assert slot_figures(slots) == {"slots_busy": 3, "slots_total": 8, "kv_cache_usage": 0.375}
    import pytest

    with pytest.raises(ValueError, match="list of slot objects"):
        slot_figures({"error": "slots endpoint disabled"})


def test_process_figures_of_this_process():
    import os
    import threading

    from harness.collectors._collectors import process_figures

    figures = process_figures(os.getpid())
    assert figures["server_threads"] >= threading.active_count()
    assert figures["server_rss_bytes"] > 10_000_000


def test_llamacpp_python_probe_metrics_fill_the_same_figures():
    text = (
        "llamacpp_python:context_usage_perc 1.0\n"
        "llamacpp_python:requests_running 1.0\n"
        "llamacpp_python:requests_waiting 2.0\n"
        "llamacpp_python:generation_tokens_total 850.0\n"
    )
    m = parse_vllm_metrics(text)
    assert m == {
        "kv_cache_usage": 1.0,
        "num_requests_running": 1.0,
        "num_requests_waiting": 2.0,
        "generation_tokens_total": 850.0,
    }
