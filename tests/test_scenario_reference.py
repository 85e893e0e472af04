"""The scenario format described from its models: docs/scenarios.md is what
``zerowindow schema --markdown`` prints (so it cannot go stale unnoticed), and the JSON Schema
of ``zerowindow schema`` accepts every example scenario and rejects a misspelt field or kind,
as an editor reading it would."""

from __future__ import annotations

import json
import subprocess
import tomllib

import jsonschema
import pytest

from harness.scenario import scenario_json_schema, scenario_reference
from tests.conftest import REPO, ZEROWINDOW

DOC = REPO / "docs" / "scenarios.md"


def test_the_reference_is_up_to_date():
    # In a process of its own: this one holds kinds that other tests registered.
    done = subprocess.run(
        [*ZEROWINDOW, "schema", "--markdown"], capture_output=True, text=True, cwd=REPO,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert DOC.read_text(encoding="utf-8") == done.stdout, (
        "docs/scenarios.md is stale: run `zerowindow schema --markdown > docs/scenarios.md`"
    )


def test_the_reference_names_every_kind_of_every_pluggable_part():
    text = scenario_reference()
    for heading in ('`target`: `kind = "vllm"`', '`proxy`: `kind = "nginx"`',
                    '`groups.read`: `kind = "paced"`', '`groups.action`: `kind = "stall"`',
                    '`target.readiness`: `kind = "http"`'):  # fmt: skip
        assert f"## {heading}" in text, heading


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = scenario_json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


@pytest.mark.parametrize("path", sorted((REPO / "scenarios").glob("*.toml")), ids=lambda p: p.name)
def test_every_example_scenario_is_valid_by_the_schema(validator, path):
    errors = list(validator.iter_errors(tomllib.loads(path.read_text())))
    assert not errors, [(list(e.path), e.message) for e in errors]


def test_the_schema_rejects_a_misspelt_field_and_an_unknown_kind(validator):
    text = (REPO / "scenarios" / "sim-coupled.toml").read_text()
    typo = tomllib.loads(text.replace("max_tokens = 128", "max_tokenz = 128"))
    assert any("max_tokenz" in e.message for e in validator.iter_errors(typo))
    kind = tomllib.loads(text.replace('kind = "paced"', 'kind = "pacd"'))
    assert [list(e.path) for e in validator.iter_errors(kind)] == [["groups", 1, "read"]]
    no_kind = tomllib.loads(text.replace('kind = "sim"\n', "", 1))
    assert any(list(e.path) == ["target"] for e in validator.iter_errors(no_kind))


def test_the_command_prints_the_schema_with_a_plugins_kinds():
    done = subprocess.run(
        [*ZEROWINDOW, "schema", "--plugin", "tests/kind_sip_read.py"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    schema = json.loads(done.stdout)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert '"const": "sip"' in done.stdout  # the plugin's read behaviour
