"""Any server from a command line: the ``command`` target and proxy kinds
(``harness.servers._command``). One run starts the toy engine program (the emulator serving
metric names of its own) as a ``command`` target whose names the scenario declares, behind the
egress buffer started as a ``command`` proxy; the rest checks what a scenario may say."""

from __future__ import annotations

import json
import sys

import pandas as pd
import psutil
import pytest

from harness import ScenarioError, parse_scenario, run_scenario
from harness.servers import PROXIES, TARGETS, known_metric_names, make_target, metric_presets
from harness.servers._metric_names import SGLANG_METRICS, read_figures
from tests.conftest import REPO

SCENARIO = """
name = "any-stack"
max_duration_s = 60
cooldown_s = 0.5

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


def test_a_command_target_behind_a_command_proxy_runs_and_is_read_by_its_declared_names(
    tmp_path,
):
    result = run_scenario(_scenario(tmp_path), out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    run_dir = result.run_dir
    assert result.summary.groups[0].outcomes == {"complete": 4}
    info = json.loads((run_dir / "run.json").read_text())
    target, proxy = info["target"], info["proxy"]
    # the templates were filled: the target's port, the proxy's upstream is the target
    port = target["base_url"].rsplit(":", 1)[1]
    assert target["argv"][target["argv"].index("--port") + 1] == port
    assert '"served_model_name": "toy"' in target["argv"][-1]
    assert proxy["argv"][proxy["argv"].index("--upstream") + 1] == target["base_url"]
    assert "GET /v1/models answered 200" in target["readiness"]["result"]
    assert proxy["readiness"]["result"].startswith("GET /health answered 200")
    assert (run_dir / "command-target.log").is_file() and (run_dir / "command-proxy.log").is_file()
    # read by the names the scenario declared (the toy engine serves no vLLM name)
    metrics = pd.read_parquet(run_dir / "server_metrics.parquet")
    assert metrics["kv_cache_usage"].max() > 0 and metrics["num_requests_running"].max() > 0
    server = json.loads((run_dir / "summary.json").read_text())["server"]
    assert server["generation_tokens"] == 256  # 4 requests of 64 tokens
    assert {why: n for why, n in server["request_success"].items() if n} == {"length": 4.0}
    # engine_tables = true: the engine wrote its tables into the run folder
    assert info["engine_probe"]["status"] not in ("not_run", "failed")
    assert (run_dir / "engine_steps.parquet").is_file()
    # its process group was stopped with the run
    pid = target["pid"]
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_command_that_dies_fails_the_run_with_its_reason(tmp_path):
    text = _text().replace('"tests/kind_toy_engine.py"', '"-c", "raise SystemExit(3)", "--"')
    result = run_scenario(parse_scenario(text, path=tmp_path / "s.toml"), out_root=tmp_path)
    assert result.exit_code == 2
    assert "command python" in (result.summary.failure or "")
    assert "exited with code 3" in (result.summary.failure or "")


def test_a_misspelt_option_is_named_at_its_line(tmp_path):
    with pytest.raises(ScenarioError, match=r"s.toml:\d+: field 'target.stop_singal'"):
        _scenario(tmp_path, target_extra='stop_singal = "SIGINT"')


def test_an_unknown_placeholder_is_named_with_the_valid_ones(tmp_path):
    text = _text().replace('"--log-level", "warning"', '"--level", "{levle}"')
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, path=tmp_path / "s.toml")
    said = str(err.value)
    assert "field 'proxy'" in said and "unknown placeholder {levle}" in said
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
