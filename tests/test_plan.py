"""One plan of runs: every pair of options composes, visibly, or is refused by name.

The matrix walks every pair of proxies, repeats, a control arm, a baseline, ``--workers``,
shaped links, progress, the rerun policy, a sweep, the suite and remote workers through the
commands' ``--dry-run`` (the plan they would run; nothing starts): each pair either shows both
options in the plan or exits 2 with a message naming both and why. One real plan on the engine
emulator then runs most of them at once (two proxy configurations x 2 repeats x a control arm
x the rerun policy x progress) and shows their effects in the folders; ``zerowindow analyze``
on its folder reproduces every aggregate file. (Locust workers in a plan of several runs:
test_comparison_netem, two workers per group behind shaped links.)
"""

from __future__ import annotations

import itertools
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness.cli import app
from tests.conftest import only_run_dir, run_cli

BASE = """\
name = "compose"
max_duration_s = 40
cooldown_s = 0.2
gates = [{gates}]
{top}
[target]
kind = "sim"
[target.engine]
step_fixed_ms = 2.0
{sections}
[[groups]]
name = "fast"
arrival = {{ kind = "poisson", rate_rps = 20, requests = 6 }}
prompt_tokens = 8
max_tokens = 24
{fast}
[[groups]]
name = "slow"
aggressor = true
users = 1
requests_per_user = 1
prompt_tokens = 8
max_tokens = 16
read = {{ kind = "paced", bytes_per_read = 512, interval_s = 0.05 }}
"""

ABSOLUTE = '"fast.outcome.complete >= 1"'
RELATIVE = '"fast.ttft_p99_ms <= 2 * baseline"'
PROXIES = '[[proxies]]\nname = "none"\nkind = "none"\n[[proxies]]\nname = "egress"\nkind = "egress"'


class Case:
    """A scenario file and a command line, built up by the features of one pair."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.gates = [ABSOLUTE]
        self.top: list[str] = []
        self.sections: list[str] = []
        self.fast: list[str] = []
        self.command = ["run"]
        self.args: list[str] = ["--no-progress"]
        self.incident = False

    def text(self) -> str:
        return BASE.format(
            gates=", ".join(self.gates), top="\n".join(self.top),
            sections="\n".join(self.sections), fast="\n".join(self.fast),
        )  # fmt: skip

    def argv(self) -> list[str]:
        folder = self.tmp / "incidents"
        folder.mkdir(exist_ok=True)
        path = folder / "compose.toml"
        if self.incident:  # an incident of the catalogue: its table after the groups
            path.write_text(self.text() + '\n[incident]\nsource = "t"\n')
            return ["suite", "run", str(folder), "--dry-run", "--out", str(self.tmp / "out")]
        path.write_text(self.text())
        args = [a for a in self.args if not (self.command == ["sweep"] and "progress" in a)]
        return [*self.command, str(path), "--dry-run", "--out", str(self.tmp / "out"), *args]


def _proxies(c: Case) -> None:
    c.sections.append(PROXIES)


def _repeats(c: Case) -> None:
    if c.command == ["run"]:
        c.args += ["--repeats", "2"]
    else:  # the sweep and the suite have no --repeats: the scenario's own
        c.top.append("repeats = 2")


def _control(c: Case) -> None:
    c.top.append("control = true")


def _baseline(c: Case) -> None:
    c.gates.append(RELATIVE)
    if c.command == ["run"]:
        c.args += ["--baseline", str(c.tmp / "base.json")]


def _workers(c: Case) -> None:
    c.args += ["--workers", "1"]


def _shaped(c: Case) -> None:
    c.fast.append('network_profile = "3g"')


def _progress(c: Case) -> None:
    c.args = [a for a in c.args if a != "--no-progress"] + ["--progress"]


def _rerun(c: Case) -> None:
    c.sections.append('[gating]\ninconclusive = "rerun"\nmax_reruns = 1')


def _sweep(c: Case) -> None:
    c.command = ["sweep"]
    c.args = [a for a in c.args if a != "--repeats" and a != "2"] + ["--steps", "1"]


def _suite(c: Case) -> None:
    c.command, c.incident = ["suite"], True


def _remote(c: Case) -> None:
    c.args += ["--remote-workers", "1"]


# Applied in this order (a command first), whatever the order of the pair.
FEATURES: dict[str, Callable[[Case], None]] = {
    "sweep": _sweep, "suite": _suite, "proxies": _proxies, "repeats": _repeats,
    "control": _control, "baseline": _baseline, "workers": _workers, "shaped": _shaped,
    "progress": _progress, "rerun": _rerun, "remote": _remote,
}  # fmt: skip
# Options a command does not have: not a pair to walk.
NOT_AN_OPTION = {
    ("sweep", "suite"), ("sweep", "progress"), ("suite", "workers"), ("suite", "progress"),
    ("suite", "remote"), ("sweep", "remote"),
}  # fmt: skip
# Pairs refused by name: what the message must name, besides the reason.
REFUSED: dict[frozenset[str], tuple[str, ...]] = {
    frozenset({"sweep", "proxies"}): ("zerowindow sweep", "proxies"),
    frozenset({"sweep", "repeats"}): ("zerowindow sweep", "repeats = 2"),
    frozenset({"sweep", "control"}): ("zerowindow sweep", "control = true"),
    frozenset({"sweep", "baseline"}): ("zerowindow sweep", "gates relative to 'baseline'"),
    frozenset({"sweep", "rerun"}): ("zerowindow sweep", 'inconclusive = "rerun"'),
    frozenset({"proxies", "baseline"}): ("gates relative to 'baseline'", "proxies"),
    frozenset({"remote", "proxies"}): ("--remote-workers 1", "several runs"),
    frozenset({"remote", "repeats"}): ("--remote-workers 1", "several runs"),
    frozenset({"remote", "control"}): ("--remote-workers 1", "several runs"),
    frozenset({"remote", "rerun"}): ("--remote-workers 1", "several runs"),
    frozenset({"remote", "shaped"}): ("--remote-workers 1", "network profiles"),
    # The suite has no --baseline: an incident's relative gates need its saved baseline.
    frozenset({"suite", "baseline"}): ("compose", "no baseline at", "results/baselines"),
}
# What each option shows in the plan it composes into.
EFFECTS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "sweep": lambda p: p["kind"] == "sweep" and p["runs"][:2] == ["serial", "throughput"],
    "suite": lambda p: p["scenario"] == "compose",
    "proxies": lambda p: p["configurations"] == ["none", "egress"]
    and any(r.startswith("egress") for r in p["runs"]),
    "repeats": lambda p: p["repeats"] == 2 and p["pooled"] and any("r2" in r for r in p["runs"]),
    "control": lambda p: p["control"] and any(r.split("/")[-1] == "c1" for r in p["runs"]),
    "baseline": lambda p: p["options"].get("baseline", "").endswith("base.json"),
    "workers": lambda p: p["options"].get("workers") == 1,
    "shaped": lambda p: p["network"] is True,
    "progress": lambda p: p["options"].get("progress") is True,
    "rerun": lambda p: p["max_reruns"] == 1 and p["pooled"],
    "remote": lambda p: p["options"].get("remote_workers") == 1,
}
PAIRS = [
    (a, b) for a, b in itertools.combinations(FEATURES, 2)
    if (a, b) not in NOT_AN_OPTION and (b, a) not in NOT_AN_OPTION
]  # fmt: skip


@pytest.mark.parametrize(("first", "second"), PAIRS, ids=[f"{a}-{b}" for a, b in PAIRS])
def test_every_pair_composes_or_is_refused_by_name(
    first: str, second: str, tmp_path: Path
) -> None:
    case = Case(tmp_path)
    for name, apply in FEATURES.items():
        if name in (first, second):
            apply(case)
    result = CliRunner().invoke(app, case.argv())
    names = REFUSED.get(frozenset({first, second}))
    if names is not None:
        assert result.exit_code == 2, result.output
        assert all(n in result.output for n in names), (names, result.output)
        assert not (tmp_path / "out").exists()
        return
    assert result.exit_code == 0, result.output
    plans = json.loads(result.output)
    plan = plans[0] if isinstance(plans, list) else plans
    for name in (first, second):
        assert EFFECTS[name](plan), (name, plan)
    assert not (tmp_path / "out").exists()  # a dry run starts nothing


# Options that only mean something beside another: refused alone, by name, not ignored.
LONE = [
    (["run"], ["--master-bind", "127.0.0.1:5600"], "--master-bind 127.0.0.1:5600 without"),
    (["run"], ["--no-baseline"], "--no-baseline with scenario 'compose'"),
    (["suite", "--target", "sim"], ["--model", "m"], "--model m with --target sim"),
    (["suite"], ["--model", "m"], "--model is for --target KIND"),
    (["suite", "--target", "sim"], ["--served-model-name", "x"], "--served-model-name is for"),
]  # fmt: skip


@pytest.mark.parametrize(("command", "args", "named"), LONE, ids=[a[0] for _, a, _ in LONE])
def test_an_option_that_needs_another_is_refused_alone(
    command: list[str], args: list[str], named: str, tmp_path: Path
) -> None:
    case = Case(tmp_path)
    if command[0] == "suite":
        case.incident = True
    result = CliRunner().invoke(app, [*case.argv(), *command[1:], *args])
    assert result.exit_code == 2 and named in result.output, result.output


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def composed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """Two configurations x 2 repeats x a control arm x the rerun policy x progress, for real
    on the emulator."""
    tmp = tmp_path_factory.mktemp("composed")
    case = Case(tmp)
    for apply in (_proxies, _control, _rerun):
        apply(case)
    path = tmp / "compose.toml"
    path.write_text(case.text())
    done = run_cli(
        "run", str(path), "--repeats", "2", "--progress",
        "--out", str(tmp / "out"), timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    return only_run_dir(tmp / "out"), done.stdout


def test_each_configuration_has_its_repeats_controls_intervals_and_gates(
    composed: tuple[Path, str],
) -> None:
    folder, stdout = composed
    record = _json(folder / "plan.json")
    assert record["plan"]["kind"] == "comparison" and record["exit_code"] == 0
    ran = [r["path"] for r in record["runs"]]
    # Round the configurations: r1 of each (with its control run), then r2.
    assert ran[:8] == [
        "none/r1", "none/c1", "egress/r1", "egress/c1",
        "none/r2", "none/c2", "egress/r2", "egress/c2",
    ]  # fmt: skip
    for arm in ("none", "egress"):
        repeats = _json(folder / arm / "repeats.json")
        assert repeats["runs"][:2] == ["r1", "r2"] and repeats["controls"][:2] == ["c1", "c2"]
        ttft = repeats["figures"]["fast.ttft_p50_ms"]
        assert ttft["method"] == "bootstrap" and ttft["low"] <= ttft["value"] <= ttft["high"]
        assert len(ttft["per_repeat"]) == len(repeats["runs"])
        assert repeats["impact"]["impact.fast.ttft_p99"] is not None
        gates = _json(folder / arm / "gates.json")["gates"]
        assert [g["verdict"] for g in gates] == ["pass"]
        # The control run is the same schedule without the aggressor.
        assert not (folder / arm / "c1" / "records-slow.jsonl").exists()
        assert (folder / arm / "r1" / "records-slow.jsonl").exists()
    parent = _json(folder / "gates.json")
    assert set(parent["arms"]) == {"none", "egress"}
    comparison = _json(folder / "comparison.json")
    assert comparison["repeats"] == {"none": 2, "egress": 2} or all(
        n >= 2 for n in comparison["repeats"].values()
    )
    assert comparison["intervals"]["egress"]["fast.ttft_p50_ms"]
    assert "compose none/r1" in stdout and "compose egress/c2" in stdout  # progress per run
    assert "egress:" in stdout and "repeats: figures with 95% intervals" in stdout
    assert "impact of the aggressors" in stdout  # each configuration's, from its control runs
    assert (folder / "report.html").stat().st_size > 10_000


def test_analyze_reproduces_every_aggregate_file(
    composed: tuple[Path, str], tmp_path: Path
) -> None:
    folder, _ = composed
    files = [
        "gates.json", "comparison.json", "comparison.md", "none/repeats.json",
        "none/gates.json", "egress/repeats.json", "egress/gates.json", "plan.json",
    ]  # fmt: skip
    before = {f: (folder / f).read_text() for f in files}
    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    done = run_cli("analyze", str(copy))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for f in files:
        assert (copy / f).read_text() == before[f], f
    assert (copy / "report.html").exists()
    report = run_cli("report", str(copy))
    assert report.returncode == 0, report.stderr
