"""Any stack: the ``command`` target and proxy kinds (``harness.servers._command``), Traefik,
the LiteLLM proxy, a chain of proxies and answers asked for whole (``stream = false``). One run
starts the toy engine program (the emulator serving metric names of its own) as a ``command``
target whose names the scenario declares, behind a chain of Traefik, LiteLLM with
``cancel_on_disconnect`` and the egress buffer started as a ``command`` proxy; a streaming
group, a group asking for whole answers and one that leaves before its whole answer comes go
through it. (LiteLLM as it ships against the same leavers is the incident
``scenarios/incidents/litellm-disconnect.toml``: two LiteLLM starts, too slow for the suite.)
The rest checks what a scenario may say."""

from __future__ import annotations

import json
import sys

import pandas as pd
import psutil
import pytest

from harness import ScenarioError, parse_scenario, run
from harness.runfolder import figures
from harness.servers import PROXIES, TARGETS, known_metric_names, make_target, metric_presets
from harness.servers._metric_names import SGLANG_METRICS, read_figures
from loadgen._openai import parse_payload, request_body
from tests.conftest import REPO

SCENARIO = """
name = "any-stack"
max_duration_s = 60
cooldown_s = 0.5
# each hop's figures are gated on as any: LiteLLM's failures are the two whole-answer leavers
gates = ["proxy.hop1.failed_requests == 2", "proxy.hop0.requests == 8",
         "proxy.hop2.rss_peak_bytes >= 1"]

[collectors]
metrics_interval_s = 0.1

[target]
kind = "command"
argv = [{python}, "tests/kind_toy_engine.py", "--host", "{{host}}", "--port", "{{port}}",
        "--engine", '{{{{"step_fixed_ms": 10, "served_model_name": "{{model}}"}}}}']
served_model_name = "toy"
cwd = "{repo}"
env = {{ TOY_RUN_DIR = "{{run_dir}}" }}
engine_tables = true
stop_signal = "SIGINT"
readiness = {{ kind = "http", path = "/v1/models" }}
{target_extra}

[proxy]
kind = "chain"

[[proxy.hops]]
kind = "traefik"
compress = true

[[proxy.hops]]
kind = "litellm"
cancel_on_disconnect = true

[[proxy.hops]]
kind = "command"
argv = [{python}, "-m", "harness._egress", "--upstream", "{{upstream}}", "--listen", "{{listen}}",
        "--log-level", "warning"]
cwd = "{repo}"
{proxy_extra}

[[groups]]
name = "fast"
users = 2
requests_per_user = 2
prompt_tokens = 16
max_tokens = 64
accept_encoding = "gzip"

[[groups]]
name = "whole"
stream = false
users = 2
requests_per_user = 1
prompt_tokens = 16
max_tokens = 96

[[groups]]
name = "whole-leave"
stream = false
endpoint = "chat"
users = 2
requests_per_user = 1
prompt_tokens = 16
max_tokens = 96
action = {{ kind = "leave", after_s = 0.5 }}
"""


TOY_NAMES = """
[target.metrics]
kv_cache_usage = ["toy_kv_used_ratio"]
num_requests_running = ["toy_active_requests"]
num_requests_waiting = ["toy_queued_requests"]
generation_tokens_total = ["toy_tokens_out_total"]
request_success_total = ["toy_finished_total"]
finish_reason_label = "why"
"""


def _text(*, target_extra: str = TOY_NAMES, proxy_extra: str = "") -> str:
    return SCENARIO.format(
        python=json.dumps(sys.executable), repo=REPO,
        target_extra=target_extra, proxy_extra=proxy_extra,
    )  # fmt: skip


def _scenario(tmp_path, **extra: str):
    return parse_scenario(_text(**extra), path=tmp_path / "s.toml")


@pytest.fixture(scope="module")
def any_stack(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("any-stack")
    result = run(_scenario(tmp_path), out_root=tmp_path).only_run()
    assert result.exit_code == 0, result.summary.failure
    return result


def test_a_command_target_behind_a_chain_is_read_by_its_declared_names(any_stack):
    result = any_stack
    run_dir = result.run_dir
    assert result.summary.groups[0].outcomes == {"complete": 4}
    info = json.loads((run_dir / "run.json").read_text())
    target, chain = info["target"], info["proxy"]
    kinds = [h["kind"] for h in chain["hops"]]
    assert chain["kind"] == "chain" and kinds == ["traefik", "litellm", "command"]
    traefik, litellm, proxy = chain["hops"]
    # the templates were filled: the target's port, the proxy's upstream is the target
    port = target["base_url"].rsplit(":", 1)[1]
    assert target["argv"][target["argv"].index("--port") + 1] == port
    assert '"served_model_name": "toy"' in target["argv"][-1]
    assert proxy["argv"][proxy["argv"].index("--upstream") + 1] == target["base_url"]
    assert "GET /v1/models answered 200" in target["readiness"]["result"]
    assert proxy["readiness"]["result"].startswith("GET /health answered 200")
    assert (run_dir / "command-target.log").is_file()
    assert (run_dir / "hops" / "2-command" / "command-proxy.log").is_file()
    # the chain started inside out: traefik forwards to litellm, litellm to the command proxy
    dynamic = (run_dir / "hops" / "0-traefik" / "traefik" / "dynamic.yaml").read_text()
    assert f"url: {litellm['url']}" in dynamic
    config = (run_dir / "hops" / "1-litellm" / "litellm" / "config.yaml").read_text()
    assert f"api_base: {proxy['url']}/v1" in config and "cancel_on_disconnect: true" in config
    # traefik compressed the streams of the clients that accept gzip: decoded event by event
    requests = pd.read_parquet(run_dir / "requests.parquet")
    fast = requests[requests["group"] == "fast"]
    assert fast["content_encoding"].eq("gzip").all() and (fast["completion_tokens"] == 64).all()
    assert requests.loc[requests["group"] != "fast", "content_encoding"].isna().all()
    # every hop's sockets were sampled: each one's connections toward the hop in front of it
    sockets = pd.read_parquet(run_dir / "sockets.parquet")
    hop_ports = {int(h["url"].rsplit(":", 1)[1]) for h in chain["hops"]}
    assert hop_ports <= set(sockets["local_port"]), (hop_ports, set(sockets["local_port"]))
    # read by the names the scenario declared (the toy engine serves no vLLM name)
    metrics = pd.read_parquet(run_dir / "server_metrics.parquet")
    assert metrics["kv_cache_usage"].max() > 0 and metrics["num_requests_running"].max() > 0
    server = json.loads((run_dir / "summary.json").read_text())["server"]
    # 4 answers of 64 tokens and 2 of 96, and what the engine made for the two that left
    assert 4 * 64 + 2 * 96 <= server["generation_tokens"] < 4 * 64 + 4 * 96
    finished = {why: n for why, n in server["request_success"].items() if n}
    assert finished.pop("length") == 6.0 and finished.get("abort", 0) <= 2
    # engine_tables = true: the engine wrote its tables into the run folder
    assert info["engine_probe"]["status"] not in ("not_run", "failed")
    assert (run_dir / "engine_steps.parquet").is_file()
    # its process group was stopped with the run
    pid = target["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_whole_answers_arrive_as_one_chunk(any_stack):
    requests = pd.read_parquet(any_stack.run_dir / "requests.parquet")
    whole = requests[requests["group"] == "whole"]
    assert list(whole["outcome"]) == ["complete"] * 2 and not whole["stream"].any()
    assert (whole["completion_tokens"] == 96).all() and (whole["n_chunks"] == 1).all()
    assert whole["finish_reason"].eq("length").all()
    # the first token is the whole answer: after 96 steps of 10 ms, with the last byte
    assert (whole["ttft_ms"] > 900).all() and whole["tpot_ms"].isna().all()
    assert ((whole["t_last_byte"] - whole["t_first_token"]).abs() < 1e-6).all()
    assert requests.loc[requests["group"] == "fast", "stream"].all()
    groups = {g.group: g for g in any_stack.summary.groups}
    assert groups["whole"].whole_answers == 2 and groups["fast"].whole_answers == 0
    assert groups["whole"].itl_p50_ms is None


def test_whole_answer_leavers_through_litellm_with_cancel_on_disconnect_are_no_zombies(
    any_stack,
):
    # by the engine's own records, joined by the X-Request-Id LiteLLM forwards: each leaver was
    # aborted by the engine, or (a gateway still slow to forward) never reached it
    leave = next(g for g in any_stack.summary.groups if g.group == "whole-leave")
    assert leave.left == 2 and leave.zombies == 0, leave
    assert leave.left_aborted + leave.leave_phases.get("frontend", 0) == 2, leave
    requests = pd.read_parquet(any_stack.run_dir / "requests.parquet")
    left = requests[requests["group"] == "whole-leave"]
    assert list(left["outcome"]) == ["client_abort"] * 2


def test_every_hop_of_the_chain_is_probed_as_a_single_proxy_is(any_stack):
    run_dir = any_stack.run_dir
    info = json.loads((run_dir / "run.json").read_text())
    # each hop listens where the hop in front of it connects, and forwards to the next one's port
    probed = info["proxy_hops"]
    kinds = ["traefik", "litellm", "command"]
    ports = [int(h["url"].rsplit(":", 1)[1]) for h in info["proxy"]["hops"]]
    target_port = int(info["target"]["base_url"].rsplit(":", 1)[1])
    assert [(h["index"], h["kind"], h["port"]) for h in probed] == list(
        zip(range(3), kinds, ports, strict=True)
    )
    assert [h["upstream_port"] for h in probed] == [*ports[1:], target_port]
    # proxy.parquet: every hop's own rows, its process tree's memory in each
    samples = pd.read_parquet(run_dir / "proxy.parquet")
    assert set(samples["hop"]) == {0, 1, 2}
    for hop, rows in samples.groupby("hop"):
        assert len(rows) > 5 and (rows["rss_bytes"] > 0).all(), hop
        assert rows["client_send_q_bytes"].notna().all(), hop
    proxy = json.loads((run_dir / "summary.json").read_text())["proxy"]
    hops = proxy["hops"]
    assert [(h["index"], h["kind"]) for h in hops] == list(enumerate(kinds))
    for h in hops:
        assert h["rss_peak_bytes"] > 0 and h["probe_samples"] > 5, h
        assert h["samples"] > 0 and h["send_q_peak_bytes"] is not None, h
        assert h["client_send_q_peak_bytes"] >= 0 and h["upstream_recv_q_peak_bytes"] >= 0, h
        assert h["buffered_peak_bytes"] is None, h  # none of them spills or says what it holds
    # the first hop's figures are the proxy's
    assert proxy["rss_peak_bytes"] == hops[0]["rss_peak_bytes"] and proxy["kind"] == "chain"
    traefik, litellm, command = (h["metrics"] for h in hops)
    requests = pd.read_parquet(run_dir / "requests.parquet")
    leavers = int((requests["outcome"] == "client_abort").sum())
    assert len(requests) == 8 and leavers == 2
    # Traefik counts every request its entry point answered (a leaver's too), when it ends;
    # the run's own readiness check came before the first sample
    assert traefik["requests"] == traefik["service_requests"] == len(requests), traefik
    assert 1 <= traefik["open_connections_peak"] <= len(requests), traefik
    # LiteLLM counts each request it finished, a leaver as failed (cancel_on_disconnect: 499)
    assert litellm["requests"] == len(requests), litellm
    assert litellm["failed_requests"] == leavers, litellm
    # in flight on its worker: the requests it serves and the probe's own scrape
    assert 2 <= litellm["in_flight_requests_peak"] <= len(requests) + 1, litellm
    assert command == {}  # a command proxy declares no metrics
    # ... and they are figures like any: gated on (the scenario's gates) and compared
    gates = json.loads((run_dir / "gates.json").read_text())
    assert len(gates["gates"]) == 3 and all(g["passed"] for g in gates["gates"]), gates
    figs = figures(any_stack.summary)
    assert figs["proxy.hop1.failed_requests"] == leavers and figs.get("proxy.hop2.requests") is None
    assert figs["proxy.hop0.rss_peak_bytes"] == proxy["rss_peak_bytes"]
    # the report draws each hop over time, under the lanes
    report = (run_dir / "report.html").read_text()
    assert all(f"hop {i} {kind}" in report for i, kind in enumerate(kinds))


def test_a_command_that_dies_fails_the_run_with_its_reason(tmp_path):
    text = _text().replace('"tests/kind_toy_engine.py"', '"-c", "raise SystemExit(3)", "--"')
    result = run(parse_scenario(text, path=tmp_path / "s.toml"), out_root=tmp_path)
    assert result.exit_code == 2
    assert "command python" in (result.failure or "")
    assert "exited with code 3" in (result.failure or "")


def test_an_action_cannot_wait_for_tokens_of_a_whole_answer(tmp_path):
    text = _text().replace(
        'action = { kind = "leave", after_s = 0.5 }',
        'action = { kind = "stall", after_tokens = 4, stall_s = 1 }',
    )
    with pytest.raises(ScenarioError, match="stall after_tokens = 4 with stream = false"):
        parse_scenario(text, path=tmp_path / "s.toml")


def test_a_whole_answer_is_asked_for_and_read_as_one_chunk():
    body = request_body(
        endpoint="chat", model="m", prompt="hi", max_tokens=3, ignore_eos=False, stream=False
    )
    assert body["stream"] is False and "stream_options" not in body
    answer = (
        b'{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":'
        b'{"role":"assistant","content":"a b c"},"finish_reason":"length"}],'
        b'"usage":{"prompt_tokens":2,"completion_tokens":3,"total_tokens":5}}'
    )
    payload = parse_payload(answer)
    assert (payload.kind, payload.text, payload.completion_tokens) == ("chunk", "a b c", 3)
    assert payload.stream_id == "chatcmpl-1" and payload.finish_reason == "length"


def test_a_misspelt_option_is_named_at_its_line(tmp_path):
    with pytest.raises(ScenarioError, match=r"s.toml:\d+: field 'target.stop_singal'"):
        _scenario(tmp_path, target_extra='stop_singal = "SIGINT"')


def test_an_unknown_placeholder_is_named_with_the_valid_ones(tmp_path):
    text = _text().replace('"--log-level", "warning"', '"--level", "{levle}"')
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, path=tmp_path / "s.toml")
    said = str(err.value)
    assert "field 'proxy.hops.2'" in said and "unknown placeholder {levle}" in said
    assert "{upstream}" in said and "{listen}" in said


def test_a_metric_preset_is_a_kinds_name_or_sglang(tmp_path):
    presets = metric_presets()
    assert {"vllm", "sim", "llama-server", "llama-cpp-python", "sglang"} <= set(presets)
    assert _scenario(tmp_path, target_extra='metrics = "vllm"').target.metrics == "vllm"
    with pytest.raises(ScenarioError, match=r"unknown preset 'sglan'; valid: .*sglang"):
        _scenario(tmp_path, target_extra='metrics = "sglan"')


def test_a_preset_reads_that_engine_and_a_url_target_reads_sglang_too():
    text = (
        'sglang:token_usage{model_name="m"} 0.25\nsglang:num_running_reqs{model_name="m"} 3\n'
        'sglang:num_queue_reqs{model_name="m"} 1\n'
    )
    want = {"kv_cache_usage": 0.25, "num_requests_running": 3.0, "num_requests_waiting": 1.0}
    assert read_figures(text, (SGLANG_METRICS,)) == want
    assert SGLANG_METRICS in known_metric_names()
    command = TARGETS.get("command")(argv=["srv"], served_model_name="m", metrics="sglang")
    assert make_target(command).read_metrics(text) == want
    none = TARGETS.get("command")(argv=["srv"], served_model_name="m")
    assert make_target(none).metric_names() == ()


def test_a_proxy_is_not_offered_completion_readiness():
    with pytest.raises(ValueError, match="completion needs the model's name"):
        PROXIES.get("command")(argv=["gw"], readiness={"kind": "completion"})
