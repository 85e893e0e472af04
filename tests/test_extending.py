"""A new kind is one file and one registration (docs/extending.md): the ``tcp-relay`` proxy kind
of ``tests/kind_tcp_relay.py`` touches no module of the toolkit, yet a scenario names it, its
options are checked like any built-in kind's, and a run goes through it."""

from __future__ import annotations

import json

import pytest

import tests.kind_tcp_relay  # noqa: F401 - registers the kind
from harness import PROXIES, ScenarioError, load_scenario, parse_scenario, reanalyze, run_scenario
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
