"""Every command turns a bad input into exit code 2 and a message that names it, through the
one mapping of ``harness._cli_errors``, never a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from harness.cli import app


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["run", "{tmp}/missing.toml"], "invalid scenario"),
        (["run", "{tmp}/missing.toml", "--baseline", "b.json", "--no-baseline"], "exclude"),
        (["analyze", "{tmp}/nothing"], "cannot analyse"),
        (["baseline", "save", "{tmp}/nothing"], "cannot save the baseline"),
        (["report", "{tmp}/nothing"], "cannot write the report"),
        (["compare", "{tmp}/a", "{tmp}/b"], "cannot compare"),
        (["compare", "{tmp}/a"], "two or more run folders, got 1"),
        (["compare", "{tmp}/a", "{tmp}/b", "--format", "yaml"], "--format 'yaml': one of"),
        (["model", "tiny", "/proc/zw-cannot-write"], "cannot write the tiny model"),
        (
            ["serve", "egress", "--upstream", "nonsense"],
            "zerowindow serve egress: error: --upstream",
        ),
        (
            # TEST-NET-1 (RFC 5737): no local address; binding fails, nothing is sent
            ["run", "scenarios/sim-coupled.toml", "--workers", "1", "--master-bind", "192.0.2.1"],
            "cannot listen on '192.0.2.1'",
        ),
    ],
)
def test_bad_input_is_exit_2_with_a_message(tmp_path, args, says):
    result = CliRunner().invoke(app, [a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2, result.output
    assert says in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
