"""What a run needs settled before anything starts: the target a ``--target-url`` stands for,
and the baseline its relative gates compare with."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from harness.gates import Baseline, baseline_path, load_baseline
from harness.scenario import Scenario, ScenarioError, needs_baseline
from harness.servers import UrlTargetConfig


def url_target(scenario: Scenario, url: str) -> UrlTargetConfig:
    """The scenario's target replaced by the server at ``url``. Raises :class:`ScenarioError`
    if ``url`` is not an http(s) URL."""
    try:
        target = scenario.target  # a url target's own readiness and timeout still apply
        same = (
            target.model_dump(include={"readiness", "startup_timeout_s"})
            if isinstance(target, UrlTargetConfig)
            else {}
        )
        return UrlTargetConfig(
            kind="url", url=url, served_model_name=target.served_model_name, **same
        )
    except ValidationError as exc:
        reason = exc.errors()[0]["msg"].removeprefix("Value error, ")
        raise ScenarioError(f"--target-url {url!r}: {reason}") from None


def baseline_for(
    scenario: Scenario, path: Path | None, *, use: bool = True
) -> tuple[Path, Baseline] | None:
    """The baseline the scenario's gates need (``None`` if no gate refers to it, or not
    ``use``). Raises :class:`~harness.BaselineError` for a baseline file, or its samples
    file, that is missing or invalid."""
    if not use or not needs_baseline(scenario.gates):
        return None
    path = path or baseline_path(scenario.name)
    baseline = load_baseline(path)
    baseline.evidence(path)  # reads its samples file: a missing one stops the run now
    return path, baseline
