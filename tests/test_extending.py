"""A new kind is one file and one registration (docs/extending.md): the ``tcp-relay`` proxy kind
of ``tests/kind_tcp_relay.py`` touches no module of the toolkit, yet a scenario names it, its
options are checked like any built-in kind's, and a run goes through it. The ``toy-engine``
target kind of ``tests/kind_toy_engine.py``, an engine with metric names of its own, runs
through ``zerowindow run`` (a comparison), the suite and ``zerowindow analyze``, its figures
read by its own names; the proxy bench takes every proxy kind that declares a configuration."""

from __future__ import annotations

import json
from typing import Literal

import pandas as pd
import pytest

import tests.kind_tcp_relay  # noqa: F401 - registers the kind
from harness import PROXIES, ScenarioError, load_scenario, parse_scenario, reanalyze, run_scenario
from harness.servers import ProxyConfigBase
from tests.conftest import REPO, run_cli

SCENARIO = """
name = "relay"
max_duration_s = 60
cooldown_s = 0.5

[target]
kind = "sim"

[proxy]
kind = "tcp-relay"
{extra}

[[groups]]
name = "fast"
users = 2
requests_per_user = 2
prompt_tokens = 16
max_tokens = 32
"""


def test_the_kind_is_registered_beside_the_built_in_ones():
    assert "tcp-relay" in PROXIES.kinds() and "nginx" in PROXIES.kinds()


def test_scenario_checks_its_options_with_file_and_line(tmp_path):
    with pytest.raises(ScenarioError) as err:
        parse_scenario(SCENARIO.format(extra="listen_hots = 1"), path=tmp_path / "s.toml")
    assert f"{tmp_path / 's.toml'}:11: field 'proxy.listen_hots'" in str(err.value)


def test_a_run_goes_through_the_new_kind(tmp_path):
    scenario = parse_scenario(SCENARIO.format(extra=""), path=tmp_path / "s.toml")
    result = run_scenario(scenario, out_root=tmp_path)
    assert result.exit_code == 0, result.summary.failure
    assert result.summary.groups[0].outcomes == {"complete": 4}
    assert result.summary.proxy is not None and result.summary.proxy.kind == "tcp-relay"
    assert (result.run_dir / "tcp-relay.log").exists()


PLUGIN_SCENARIO = """
plugins = ["{plugin}"]
name = "bursty"
max_duration_s = 60
cooldown_s = 0.5

[target]
kind = "sim"

[[groups]]
name = "bursty"
users = 2
requests_per_user = 2
prompt_tokens = 16
max_tokens = 32
read = {{ kind = "sip", bytes_per_read = 256, pause_s = 0.005 }}
"""


def test_a_read_behaviour_named_in_plugins_runs_from_the_command_line(tmp_path):
    # the plugin is a file beside the scenario; the CLI and the Locust process import it
    (tmp_path / "sip_read.py").write_text((REPO / "tests" / "kind_sip_read.py").read_text())
    scenario = tmp_path / "bursty.toml"
    scenario.write_text(PLUGIN_SCENARIO.format(plugin="sip_read.py"))
    done = run_cli("run", str(scenario), "--out", str(tmp_path / "runs"), "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "bursty").iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["groups"][0]["outcomes"] == {"complete": 4}
    # the run keeps a copy of the plugin: the folder is analysed where the file is not
    (tmp_path / "sip_read.py").unlink()
    assert (run_dir / "plugins" / "0-sip_read.py").is_file()
    assert reanalyze(run_dir).exit_code == 0


def test_a_missing_plugin_is_reported_at_its_line(tmp_path):
    scenario = tmp_path / "bursty.toml"
    scenario.write_text(PLUGIN_SCENARIO.format(plugin="nowhere.py"))
    with pytest.raises(ScenarioError, match=r"bursty.toml:2: field 'plugins': plugin .*nowhere.py"):
        load_scenario(scenario)
    scenario.write_text(PLUGIN_SCENARIO.format(plugin="no_such_module_zw"))
    with pytest.raises(ScenarioError, match="no such module on sys.path"):
        load_scenario(scenario)
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    scenario.write_text(PLUGIN_SCENARIO.format(plugin="exits.py"))
    with pytest.raises(ScenarioError, match="exits.py' failed to import: SystemExit: 3"):
        load_scenario(scenario)


def test_a_file_plugin_imports_the_modules_beside_it(tmp_path):
    (tmp_path / "kinds").mkdir()
    (tmp_path / "kinds" / "zw_sip_helper.py").write_text("PAUSE_S = 0.005\n")
    plugin = (REPO / "tests" / "kind_sip_read.py").read_text()
    (tmp_path / "kinds" / "sip2.py").write_text(
        plugin.replace('"sip"', '"sip2"').replace("class SipRead", "class SipRead2")
        + "\nfrom zw_sip_helper import PAUSE_S  # noqa: E402, F401\n"
    )
    scenario = tmp_path / "s.toml"
    scenario.write_text(
        PLUGIN_SCENARIO.format(plugin="kinds/sip2.py").replace('kind = "sip"', 'kind = "sip2"')
    )
    assert load_scenario(scenario).groups[0].read.kind == "sip2"


# A target kind from a plugin file: the toy engine of tests/kind_toy_engine.py serves the
# emulator under metric names of its own (toy_*), so every scraped figure below was read by the
# names its kind declares, never by vLLM's.
TOY_PLUGIN = REPO / "tests" / "kind_toy_engine.py"
TOY_SCENARIO = """
plugins = ["kind_toy_engine.py"]
name = "{name}"
max_duration_s = 60
cooldown_s = 0.5
{top}
[collectors]
metrics_interval_s = 0.1

[target]
kind = "toy-engine"

[target.engine]
step_fixed_ms = 10.0
{proxies}
[[groups]]
name = "fast"
users = 2
requests_per_user = 2
prompt_tokens = 16
max_tokens = 64
"""
COMPARISON = """
[[proxies]]
name = "none"
kind = "none"

[[proxies]]
name = "egress"
kind = "egress"
"""
INCIDENT = """gates = ["fast.outcome.complete == 4", "server.scraped_kv_cache_usage_peak_perc > 0"]

[incident]
source = "tests/kind_toy_engine.py"
summary = "the toy engine serves every request"
findings = ["server.generation_tokens >= 256"]
"""


def _read_by_its_own_names(run_dir):
    """Assert that the run scraped the toy engine's KV usage, running and waiting (and every
    other figure) from its own names, and kept its versions and engine tables."""
    metrics = pd.read_parquet(run_dir / "server_metrics.parquet")
    for column in ("kv_cache_usage", "num_requests_running", "num_requests_waiting"):
        assert column in metrics and metrics[column].notna().all(), column
    assert metrics["kv_cache_usage"].max() > 0 and metrics["num_requests_running"].max() > 0
    server = json.loads((run_dir / "summary.json").read_text())["server"]
    assert server["missing_metrics"] == []
    assert server["scraped_kv_cache_usage_peak_perc"] > 0
    assert server["generation_tokens"] == 256  # 4 requests of 64 tokens
    # finished requests by reason, from its own counter and label
    assert {why: n for why, n in server["request_success"].items() if n} == {"length": 4.0}
    info = json.loads((run_dir / "run.json").read_text())
    assert info["versions"]["toy-engine"] == "0.0.1" and info["versions"]["zerowindow"]
    # its kind declares that its engine writes the engine tables, and it did
    assert info["engine_probe"]["status"] not in ("not_run", "failed")
    assert (run_dir / "engine_steps.parquet").is_file()


def test_a_target_kind_from_a_plugin_runs_a_comparison_read_by_its_own_names(tmp_path):
    (tmp_path / "kind_toy_engine.py").write_text(TOY_PLUGIN.read_text())
    scenario = tmp_path / "toy.toml"
    scenario.write_text(TOY_SCENARIO.format(name="toy", top="", proxies=COMPARISON))
    out = tmp_path / "runs"
    done = run_cli("run", str(scenario), "--out", str(out), "--no-progress")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (plan_dir,) = (out / "toy").iterdir()
    plan = json.loads((plan_dir / "plan.json").read_text())
    assert [r["path"] for r in plan["runs"]] == ["none", "egress"]
    # the engine was idle before each run, by the toy engine's own gauges
    assert all(isinstance(s, float) for s in plan["idle_wait_s"].values())
    assert plan["versions"]["toy-engine"] == "0.0.1"
    for arm in ("none", "egress"):
        _read_by_its_own_names(plan_dir / arm)
    # analysed again where the plugin file is not: the folders keep a copy
    (tmp_path / "kind_toy_engine.py").unlink()
    gates = (plan_dir / "gates.json").read_text()
    again = run_cli("analyze", str(plan_dir))
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert (plan_dir / "gates.json").read_text() == gates
    _read_by_its_own_names(plan_dir / "egress")


def test_the_suite_runs_an_incident_on_a_target_kind_from_a_plugin(tmp_path):
    incidents = tmp_path / "incidents"
    incidents.mkdir()
    (incidents / "kind_toy_engine.py").write_text(TOY_PLUGIN.read_text())
    (incidents / "toy-served.toml").write_text(
        TOY_SCENARIO.format(name="toy-served", top=INCIDENT, proxies="")
    )
    done = run_cli("suite", "run", str(incidents), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (suite_dir,) = (tmp_path / "out" / "suite").iterdir()
    junit = (suite_dir / "junit.xml").read_text()
    assert 'name="toy-served"' in junit and "<failure" not in junit
    (run_dir,) = {p.parent for p in suite_dir.rglob("server_metrics.parquet")}
    _read_by_its_own_names(run_dir)


def test_the_proxy_bench_takes_every_proxy_kind_that_declares_itself_benchmarkable(monkeypatch):
    from harness.benchmarks._proxy_bench import bench_configs

    names = list(bench_configs())
    assert names[0] == "none"
    assert {"egress", "nginx", "haproxy", "haproxy-nodelay", "envoy"} <= set(names)
    assert "tcp-relay" not in names  # its kind declares no bench configuration

    class BenchRelayConfig(tests.kind_tcp_relay.TcpRelayConfig):
        kind: Literal["bench-relay"] = "bench-relay"

        @classmethod
        def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
            return {"relay": cls()}

    monkeypatch.setattr(PROXIES, "_by_kind", dict(PROXIES._by_kind))  # registered for this test
    PROXIES.register(BenchRelayConfig)
    assert bench_configs()["relay"] == BenchRelayConfig()


def test_an_output_kind_from_a_plugin_writes_into_every_concluded_folder(tmp_path):
    (tmp_path / "csv_output.py").write_text((REPO / "tests" / "kind_csv_output.py").read_text())
    scenario = tmp_path / "csv.toml"
    scenario.write_text(
        'plugins = ["csv_output.py"]\nname = "csv"\nmax_duration_s = 30\ncooldown_s = 0.2\n'
        '[target]\nkind = "sim"\n[[groups]]\nname = "fast"\nusers = 1\nrequests_per_user = 2\n'
        "max_tokens = 8\n"
    )
    done = run_cli("run", str(scenario), "--out", str(tmp_path / "runs"), "--no-progress")
    assert done.returncode == 0, done.stdout + done.stderr
    (run_dir,) = (tmp_path / "runs" / "csv").iterdir()
    assert len((run_dir / "requests.csv").read_text().splitlines()) == 1 + 2
    (run_dir / "requests.csv").unlink()
    assert reanalyze(run_dir).exit_code == 0  # the kept plugin writes it again
    assert (run_dir / "requests.csv").is_file()
