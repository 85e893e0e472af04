"""Parsing of vLLM's Prometheus exposition."""

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
