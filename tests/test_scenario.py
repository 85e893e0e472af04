"""Scenario validation: errors name the file, the line and the field; the CLI exits 2."""

from pathlib import Path

import pytest

from harness.scenario import ScenarioError, load_scenario, parse_scenario
from tests.conftest import REPO, run_cli

GOOD = """
name = "t"
[target]
kind = "url"
url = "http://127.0.0.1:9"
served_model_name = "tiny"

[[groups]]
name = "fast"
users = 1
requests_per_user = 1

[[groups]]
name = "slow"
users = 2
requests_per_user = 1
rcvbuf_bytes = 4096
read = { kind = "paced", bytes_per_read = 64, interval_s = 0.1 }
action = { kind = "stop_reading", after_tokens = 8, hold_s = 5 }
"""


def test_example_scenarios_validate():
    for path in sorted((REPO / "scenarios").glob("*.toml")):
        assert load_scenario(path).groups


def test_good_scenario_parses():
    s = parse_scenario(GOOD, path=Path("x.toml"))
    assert [g.name for g in s.groups] == ["fast", "slow"]
    assert s.groups[1].read.kind == "paced"


def test_wrong_type_names_field_and_line():
    text = GOOD.replace("users = 2", 'users = "two"')
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("bad.toml"))
    msg = str(exc.value)
    line = text.splitlines().index('users = "two"') + 1
    assert f"bad.toml:{line}" in msg
    assert "groups.1.users" in msg


def test_unknown_read_kind_lists_valid_kinds():
    text = GOOD.replace('kind = "paced"', 'kind = "sloth"')
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("bad.toml"))
    msg = str(exc.value)
    assert "groups.1.read" in msg
    assert "paced" in msg and "full_speed" in msg


def test_unknown_field_and_missing_target_are_reported():
    text = GOOD.replace('name = "t"', 'name = "t"\nspeed = 3').replace(
        'served_model_name = "tiny"\n', ""
    )
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("bad.toml"))
    msg = str(exc.value)
    assert "'speed'" in msg and "Extra inputs are not permitted" in msg
    assert "target.url.served_model_name" in msg or "target.served_model_name" in msg


def test_toml_syntax_error_names_line():
    with pytest.raises(ScenarioError, match=r"bad.toml: not valid TOML: .*line 2"):
        parse_scenario('name = "t"\nusers = = 3\n', path=Path("bad.toml"))


def test_cli_exits_2_without_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD.replace("users = 2", "users = 0"))
    result = run_cli("run", str(bad), "--out", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2
    assert "groups.1.users" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "out").exists()


def test_cli_missing_file_exits_2(tmp_path):
    result = run_cli("run", str(tmp_path / "nope.toml"), timeout=120)
    assert result.returncode == 2
    assert "cannot read the scenario file" in result.stderr


def test_serve_sim_passes_options_to_the_emulator():
    result = run_cli("serve", "sim", "--num-blocks", "x", timeout=120)
    assert result.returncode == 2
    assert "--num-blocks: invalid int value: 'x'" in result.stderr


def test_missing_field_points_at_its_group_and_union_fields_keep_their_name():
    text = GOOD.replace("requests_per_user = 1\n\n[[groups]]", "request_per_user = 1\n\n[[groups]]")
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("bad.toml"))
    line = next(i for i, t in enumerate(text.splitlines(), 1) if t.startswith("request_per_user"))
    assert (
        f"bad.toml:{line}: field 'groups.0.request_per_user' (group 'fast'): Extra inputs are "
        "not permitted (got 1) (did you mean 'requests_per_user'?)" in str(exc.value)
    )
    text = GOOD.replace("requests_per_user = 1\n\n[[groups]]", "\n[[groups]]")
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(text, path=Path("bad.toml"))
    first_group = text.splitlines().index("[[groups]]") + 1
    assert (
        f"bad.toml:{first_group}: field 'groups.0' (group 'fast'): Value error, "
        "requests_per_user is required (or an arrival" in str(exc.value)
    )
    with pytest.raises(ScenarioError, match=r"field 'target.url': .*http://"):
        parse_scenario(GOOD.replace("http://127.0.0.1:9", "ftp://x"), path=Path("bad.toml"))


def test_group_names_must_be_usable_as_file_names():
    with pytest.raises(ScenarioError, match="groups.0.name"):
        parse_scenario(GOOD.replace('name = "fast"', 'name = "a/b"'), path=Path("bad.toml"))


def test_non_utf8_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "binary.toml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ScenarioError, match="not a UTF-8 text file"):
        load_scenario(bad)


def test_cli_rejects_a_target_url_that_is_not_http(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    result = run_cli("run", str(good), "--target-url", "foo", "--out", str(tmp_path / "o"))
    assert result.returncode == 2
    assert "--target-url 'foo': expected http://HOST:PORT" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "url",
    ["https://127.0.0.1:8000", "http://127.0.0.1:abc", "http://127.0.0.1:8000 ", "http://h:1/v1",
     "http://h:1?x=1", "http://h:99999"],
)  # fmt: skip
def test_target_urls_the_load_generator_cannot_use_are_rejected(url):
    text = GOOD.replace("http://127.0.0.1:9", url)
    with pytest.raises(ScenarioError, match=r"field 'target.url': .*expected http://HOST:PORT"):
        parse_scenario(text, path=Path("bad.toml"))


def test_the_harness_does_not_import_gevent():
    """Locust monkey-patches the process it is imported into; the harness runs threads (the
    engine emulator, the egress buffer, the samplers) and must stay unpatched: load runs in
    separate Locust processes. Every module of every package is imported, except loadgen's
    Locust-bound ones and the engine probes, which load into the engine's own process (vLLM's,
    llama-cpp-python's)."""
    code = (
        "import importlib, pkgutil, sys\n"
        "locust_bound = {'loadgen.locustfile', 'loadgen._users', 'loadgen._lifecycle',\n"
        "                'loadgen._saturation', 'loadgen._distributed', 'loadgen._sessions',\n"
        "                'harness._engine_probe._vllm_scheduler',\n"
        "                'harness._engine_probe._llamacpp_python'}\n"
        "for pkg in ('zwcore', 'netem', 'loadgen', 'harness'):\n"
        "    root = importlib.import_module(pkg)\n"
        "    for info in pkgutil.walk_packages(root.__path__, pkg + '.'):\n"
        "        if info.name not in locust_bound and not info.name.endswith('__main__'):\n"
        "            importlib.import_module(info.name)\n"
        "bad = [m for m in ('gevent', 'locust') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
