"""Reading the engines' Prometheus exposition by each target kind's own metric names (vLLM,
llama-server, the llama-cpp-python probe; a ``url`` target by every kind's), llama-server's
/slots and the engine process's figures."""

import httpx
import pytest

from harness._sim import SimConfig, SimServer
from harness.servers import (
    TARGETS,
    LlamaCppPythonTargetConfig,
    LlamaServerTargetConfig,
    MetricNames,
    SimTargetConfig,
    UrlTargetConfig,
    VllmTargetConfig,
    known_metric_names,
    make_target,
    read_figures,
)
from harness.servers._metric_names import EXTRA_PRESETS


def _names(kind: str) -> tuple[MetricNames, ...]:
    names = TARGETS.get(kind).metric_names
    assert names is not None
    return (names,)


def _url_target(url: str = "http://127.0.0.1:1"):
    return make_target(UrlTargetConfig(kind="url", url=url, served_model_name="m"))


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


def test_vllm_names_read_its_figures():
    m = read_figures(TEXT, _names("vllm"))
    assert m["kv_cache_usage"] == 0.25
    assert m["num_requests_running"] == 3.0
    assert m["num_preemptions_total"] == 7.0
    assert m["request_success_length"] == 4.0 and m["request_success_stop"] == 1.0
    assert m["ttft_seconds_count"] == 5.0 and m["ttft_seconds_sum"] == 0.9
    assert "num_requests_waiting" not in m  # missing, not fatal


def test_older_gpu_cache_name_is_accepted():
    text = "# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc 0.5\n"
    assert read_figures(text, _names("vllm"))["kv_cache_usage"] == 0.5


def test_the_emulator_is_read_by_vllms_names():
    assert TARGETS.get("sim").metric_names is TARGETS.get("vllm").metric_names


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
    m = read_figures(LLAMA_SERVER_TEXT, _names("llama-server"))
    assert m["num_requests_running"] == 4.0
    assert m["num_requests_waiting"] == 1.0
    assert m["generation_tokens_total"] == 112.0
    assert "kv_cache_usage" not in m  # llama-server has none: /slots gives it


def test_slot_figures_count_busy_slots_as_kv_usage():
    from harness.collectors._collectors import slot_figures

    slots = [{"id": i, "is_processing": i < 3} for i in range(8)]
    assert slot_figures(slots) == {"slots_busy": 3, "slots_total": 8, "kv_cache_usage": 0.375}
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
    m = read_figures(text, _names("llama-cpp-python"))
    assert m == {
        "kv_cache_usage": 1.0,
        "num_requests_running": 1.0,
        "num_requests_waiting": 2.0,
        "generation_tokens_total": 850.0,
    }


def test_one_kinds_names_do_not_read_another_engine():
    assert read_figures(TEXT, _names("llama-server")) == {}
    assert read_figures(LLAMA_SERVER_TEXT, _names("vllm")) == {}


def test_a_url_target_reads_every_registered_engine():
    url = _url_target()
    assert url.read_metrics(TEXT) == read_figures(TEXT, _names("vllm"))
    assert url.read_metrics(LLAMA_SERVER_TEXT)["num_requests_waiting"] == 1.0
    kinds = [k for k in TARGETS.kinds() if TARGETS.get(k).metric_names is not None]
    assert {"vllm", "sim", "llama-server", "llama-cpp-python"} <= set(kinds)
    kinds_names = {TARGETS.get(k).metric_names for k in kinds}
    assert set(known_metric_names()) == kinds_names | set(EXTRA_PRESETS.values())
    assert url.metric_names() == known_metric_names()


def test_a_finish_reason_label_and_names_of_a_kinds_own():
    names = MetricNames(
        num_requests_running=("eng_busy",),
        request_success_total=("eng_done_total",),
        finish_reason_label="why",
        ttft_seconds=("eng_first_seconds",),
    )
    text = (
        'eng_busy{shard="0"} 2\neng_busy{shard="1"} 1\n'  # label sets are summed
        'eng_done_total{why="stop"} 3\neng_done_total{why="abort"} 1\n'
        'eng_first_seconds_bucket{le="+Inf"} 4\neng_first_seconds_count 4\n'
        "eng_first_seconds_sum 0.5\n"
    )
    assert read_figures(text, (names,)) == {
        "num_requests_running": 3.0,
        "request_success_stop": 3.0,
        "request_success_abort": 1.0,
        "ttft_seconds_count": 4.0,
        "ttft_seconds_sum": 0.5,
    }
    with pytest.raises(TypeError, match="a tuple of names"):
        MetricNames(kv_cache_usage="eng_kv")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        read_figures("this is { not an exposition", (names,))


def test_each_kind_reports_the_versions_of_its_engine():
    sim = make_target(SimTargetConfig()).versions()
    assert list(sim) == ["sim"] and sim["sim"]
    assert set(make_target(VllmTargetConfig(model="m")).versions()) == {"vllm", "torch"}
    llama = make_target(LlamaCppPythonTargetConfig()).versions()
    assert list(llama) == ["llama-cpp-python"]
    assert "llama-server" in make_target(LlamaServerTargetConfig()).versions()
    assert _url_target().versions() == {}


def test_which_kinds_write_engine_tables_is_declared():
    declared = {k: TARGETS.get(k).writes_tables for k in TARGETS.kinds()}
    assert declared["sim"] and declared["vllm"] and declared["llama-cpp-python"]
    assert not declared["llama-server"] and not declared["url"]
    assert make_target(VllmTargetConfig(model="m", engine_probe="off")).probe_loaded is False


def test_the_idle_test_reads_the_engine_by_its_kinds_names():
    with SimServer(SimConfig(step_fixed_ms=5.0)) as srv, httpx.Client(timeout=5) as client:
        assert _url_target(srv.url).idle(client) is True
        sim = make_target(SimTargetConfig())
        sim.base_url = srv.url  # the emulator's kind, reached where it runs
        assert sim.idle(client) is True
        body = {"model": "sim", "prompt": "hi", "max_tokens": 400, "stream": True}
        with client.stream("POST", f"{srv.url}/v1/completions", json=body) as stream:
            lines = stream.iter_lines()  # kept: a generator dropped would close the stream
            assert next(lines).startswith("data: ")  # the first token: the request runs
            assert sim.idle(client) is False
        llama = make_target(LlamaServerTargetConfig())
        llama.base_url = srv.url  # llama-server's names: the emulator reports no such gauge
        assert llama.idle(client) is None
