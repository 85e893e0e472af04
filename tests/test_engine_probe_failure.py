"""A probe that cannot load: refused with a clear message, and the vllm target's answer to it
(fail the start, or fall back to scrape-only when the scenario allows it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness._engine_probe import PROBE_ERROR, write_status
from harness.servers import VllmTargetConfig
from harness.servers._process import ServerProcess
from harness.servers._vllm import PROBE_CLASS, VllmTarget
from tests.conftest import REPO, vllm_available
from zwcore import TargetError


@pytest.mark.vllm
@pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")
def test_a_vllm_without_a_hooked_method_refuses_the_probe_by_name():
    code = (
        "import vllm.v1.core.sched.scheduler as s\n"
        "del s.Scheduler._free_request_blocks\n"
        "import harness._engine_probe._vllm_scheduler\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300
    )
    assert done.returncode != 0
    assert f"ImportError: {PROBE_ERROR}: vLLM" in done.stderr
    assert "Scheduler._free_request_blocks" in done.stderr


class _Launches:
    """Stands in for the process launch only (``ServerProcess.launch``): each call appends
    the argv it would run and does what the next item of ``outcomes`` says (write a log line
    and fail, write a probe status, or succeed)."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.argvs: list[list[str]] = []

    def __call__(self, argv: list[str], *, log_path: Path, **_: object) -> None:
        self.argvs.append(argv)
        run_dir = log_path.parent
        outcome = self.outcomes.pop(0)
        if outcome == "import_error":
            with open(log_path, "a") as log:
                log.write(f"ImportError: {PROBE_ERROR}: vLLM 9.9 has no Scheduler.schedule\n")
            raise TargetError("vLLM exited with code 1")
        if outcome == "probe_failed":
            write_status(run_dir, engine="vllm", status="failed", reason="disk full")
        if outcome == "probe_running":
            write_status(run_dir, engine="vllm", status="running", base_class="x")


def _target(monkeypatch, tmp_path, mode: str, outcomes: list[str]) -> tuple[VllmTarget, _Launches]:
    launches = _Launches(outcomes)
    monkeypatch.setattr(ServerProcess, "launch", lambda self, argv, **kw: launches(argv, **kw))
    monkeypatch.setattr(VllmTarget, "stop", lambda self: None)
    config = VllmTargetConfig(kind="vllm", model=str(tmp_path), engine_probe=mode)
    return VllmTarget(config), launches


def test_on_fails_the_start_naming_the_probe_and_the_switches(monkeypatch, tmp_path):
    target, launches = _target(monkeypatch, tmp_path, "on", ["import_error"])
    with pytest.raises(TargetError) as err:
        target.start(tmp_path)
    message = str(err.value)
    assert "engine probe could not load" in message and "Scheduler.schedule" in message
    assert 'engine_probe = "fallback"' in message and '"off"' in message
    assert PROBE_CLASS in launches.argvs[0]


def test_fallback_restarts_without_the_probe_and_says_why(monkeypatch, tmp_path):
    target, launches = _target(monkeypatch, tmp_path, "fallback", ["import_error", "plain"])
    target.start(tmp_path)
    assert PROBE_CLASS in launches.argvs[0] and PROBE_CLASS not in launches.argvs[1]
    facts = target.engine_probe()
    assert facts["status"] == "not_run" and facts["requested"] == "fallback"
    assert "could not load" in facts["reason"] and target.engine_dir is None


def test_a_probe_that_reports_failure_at_start_is_not_trusted(monkeypatch, tmp_path):
    target, _ = _target(monkeypatch, tmp_path, "on", ["probe_failed"])
    with pytest.raises(TargetError, match="disk full"):
        target.start(tmp_path)
    target, launches = _target(monkeypatch, tmp_path, "fallback", ["probe_failed", "plain"])
    target.start(tmp_path)
    assert len(launches.argvs) == 2 and "disk full" in target.engine_probe()["reason"]


def test_a_running_probe_is_recorded_and_off_loads_none(monkeypatch, tmp_path):
    target, _ = _target(monkeypatch, tmp_path, "on", ["probe_running"])
    target.start(tmp_path)
    facts = target.engine_probe()
    assert facts["status"] == "running" and target.engine_dir == tmp_path
    off, launches = _target(monkeypatch, tmp_path / "off", "off", ["plain"])
    (tmp_path / "off").mkdir()
    off.start(tmp_path / "off")
    assert PROBE_CLASS not in launches.argvs[0] and off.engine_probe()["status"] == "not_run"
    own = VllmTarget(
        VllmTargetConfig(kind="vllm", model="m", extra_args=["--scheduler-cls=my.Sched"])
    )
    assert not own.probe_loaded and "--scheduler-cls" in own.engine_probe()["reason"]


def test_a_url_target_with_a_missing_engine_dir_fails_its_start(tmp_path):
    from harness.servers import UrlTargetConfig
    from harness.servers._url import UrlTarget

    config = UrlTargetConfig(
        kind="url", url="http://127.0.0.1:9", served_model_name="m", engine_dir=str(tmp_path / "x")
    )
    with pytest.raises(TargetError, match=r"\[target\] engine_dir .*x: no such folder"):
        UrlTarget(config).start(tmp_path)


def test_a_missing_model_fails_before_vllm_starts_naming_it(monkeypatch, tmp_path):
    from harness.servers._vllm import missing_model

    launches = _Launches([])
    monkeypatch.setattr(ServerProcess, "launch", launches)
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "hf-cache"
    for model, says in (
        ("models/nope", f"'{tmp_path / 'models' / 'nope'}' does not exist"),
        ("./nope", f"model folder '{tmp_path / 'nope'}' does not exist"),
        ("someorg/some-model", f"nor in the Hugging Face cache ({cache})"),
    ):
        target = VllmTarget(
            VllmTargetConfig(kind="vllm", model=model, env={"HF_HUB_CACHE": str(cache)})
        )
        with pytest.raises(TargetError, match="does not exist") as err:
            target.start(tmp_path)
        assert says in str(err.value) and "LocalEntryNotFoundError" not in str(err.value)
    assert launches.argvs == []  # vLLM was never started
    assert missing_model(str(tmp_path), env={}) is None  # a folder that exists
    assert missing_model("someorg/some-model", env={"HF_HUB_OFFLINE": "0"}) is None
