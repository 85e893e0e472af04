"""``zerowindow netem apply`` takes a profile from a file as well as a preset name: a TOML file
with one profile table, or one of a scenario's ``[netem.profiles]``; each bad input names the
file and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from netem import NetemError, UnknownPreset, preset, profile_argument


def test_a_preset_name_is_the_preset():
    assert profile_argument("3g") == preset("3g")
    with pytest.raises(UnknownPreset):
        profile_argument("5g")


def test_a_file_with_one_profile_table(tmp_path: Path):
    path = tmp_path / "train.toml"
    path.write_text('preset = "3g"\n[down]\nloss_pct = 2\n[up]\ndelay_ms = 80\n')
    link = profile_argument(str(path))
    assert link.down.loss_pct == 2 and link.up.delay_ms == 80
    assert link.down.rate_kbit == preset("3g").down.rate_kbit  # the rest from the preset


def test_a_profile_of_a_scenario(tmp_path: Path):
    path = tmp_path / "s.toml"
    path.write_text(
        'name = "s"\n[netem.profiles.tunnel]\ndown = { delay_ms = 40 }\n'
        "[netem.profiles.cave]\ndown = { delay_ms = 400 }\n"
    )
    assert profile_argument(f"{path}:cave").down.delay_ms == 400
    assert profile_argument(f"{path}:cave").name == "cave"
    with pytest.raises(NetemError, match=r"s\.toml:NAME \(cave, tunnel\)"):
        profile_argument(str(path))  # two profiles: which?
    with pytest.raises(NetemError, match="cave, tunnel"):
        profile_argument(f"{path}:lift")


def test_bad_files_name_the_file_and_the_problem(tmp_path: Path):
    with pytest.raises(NetemError, match="nope.toml: No such file"):
        profile_argument(str(tmp_path / "nope.toml"))
    bad = tmp_path / "bad.toml"
    bad.write_text("[down]\ndelay_ms = -5\n")
    with pytest.raises(NetemError, match=r"bad\.toml: down\.delay_ms: Input should be greater"):
        profile_argument(str(bad))
    broken = tmp_path / "broken.toml"
    broken.write_text("[down\n")
    with pytest.raises(NetemError, match="broken.toml: not TOML"):
        profile_argument(str(broken))
    with pytest.raises(NetemError, match="has no \\[netem.profiles\\] table"):
        profile_argument(f"{bad}:x")


def test_the_command_says_it_without_a_traceback(tmp_path: Path):
    result = CliRunner().invoke(
        app, ["netem", "apply", str(tmp_path / "nope.toml"), "--ifname", "zw-none"]
    )
    assert result.exit_code == 2, result.output
    assert "cannot shape zw-none" in result.output and "nope.toml" in result.output
    assert "Traceback" not in result.output
