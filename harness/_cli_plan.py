"""What the command line shows of a plan's result, whatever its kind: the run's tables, the
figures over repeats with their intervals, the comparison side by side, the sweep's table,
the gates, and the GitHub step summary (``$GITHUB_STEP_SUMMARY``)."""

from __future__ import annotations

import typer

from harness.lifecycle import ArmResult, PlanResult
from harness.outputs import (
    STEP_SUMMARY_ENV,
    append_markdown,
    print_comparison,
    print_gates,
    print_hops,
    print_repeats,
    print_summary,
    print_sweep,
    repeats_markdown,
    step_summary_markdown,
    to_markdown,
)
from harness.runfolder import REPORT_HTML


def _verdict_lines(arm: ArmResult) -> list[tuple[str, list[str]]]:
    return [
        (run.run_dir.name, [v["line"] for v in run.summary.verdicts.values() if "line" in v])
        for run in [*arm.runs, *arm.controls]
    ]


def _show_arm(result: PlanResult, arm: ArmResult) -> str:
    """Print one pooled arm; its step-summary section."""
    plan = result.plan
    title = f"{plan.scenario.name} {arm.name}" if plan.kind == "comparison" else plan.scenario.name
    if plan.kind == "comparison":
        typer.echo(f"{arm.name}:")
    print_repeats(
        arm.estimates, arm.gates, repeats=len(arm.runs), confidence=plan.confidence,
        impact=arm.impact, verdicts=_verdict_lines(arm),
    )  # fmt: skip
    code = 1 if any(not g.passed for g in arm.gates) else 0
    print_gates(arm.gates, exit_code=code if plan.kind == "comparison" else result.exit_code)
    return repeats_markdown(
        title, arm.estimates, arm.gates, run_dir=arm.run_dir, exit_code=result.exit_code,
        impact=arm.impact,
    )  # fmt: skip


def show_plan(result: PlanResult) -> None:
    """Print ``result`` (module docstring) and append its section to the step summary."""
    plan = result.plan
    markdown = ""
    said = False  # the failure, by the run's own tables
    if plan.single:
        run = result.only_run()
        print_summary(run.summary, run_dir=str(run.run_dir))
        said = run.summary.failure == result.failure
        print_gates(run.gates, exit_code=result.exit_code)
        markdown = step_summary_markdown(
            run.summary, run.gates, run_dir=run.run_dir, exit_code=result.exit_code
        )
    elif result.sweep is not None:
        print_sweep(result.sweep.as_dict(), title=plan.scenario.name)
    else:
        if result.comparison is not None:
            print_comparison(result.comparison, title=plan.scenario.name)
            markdown = to_markdown(result.comparison, title=plan.scenario.name)
        print_hops({name: run.summary for name, run in result.runs.items()})
        for arm in result.arms.values():
            if plan.pooled:
                markdown += _show_arm(result, arm)
            elif arm.gates:  # its own gates' exit code; the plan's is the worst of them
                typer.echo(f"gates of {arm.name}:")
                print_gates(arm.gates, exit_code=int(any(not g.passed for g in arm.gates)))
    try:
        append_markdown(markdown) if markdown else None
    except OSError as exc:
        typer.echo(f"cannot append to ${STEP_SUMMARY_ENV}: {exc}", err=True)
    if result.failure and result.exit_code and not said:
        typer.secho(f"{plan.scenario.name} ({plan.kind}): {result.failure}", fg="red", err=True)
    if (report := result.run_dir / REPORT_HTML).exists():
        typer.echo(f"report: {report}")
    if not plan.single:  # a run's tables end with its folder
        typer.echo(f"results: {result.run_dir}")
    if result.history is not None:
        typer.echo(result.history.line())


def parse_rates(text: str | None) -> list[float] | None:
    """``--rates 2,4.5,8`` as floats. Raises ``ValueError`` naming the bad item."""
    if text is None:
        return None
    out = []
    for item in text.split(","):
        try:
            rate = float(item)
        except ValueError:
            raise ValueError(f"--rates: {item.strip()!r} is not a number of requests/s") from None
        if not rate > 0:
            raise ValueError(f"--rates: {item.strip()!r} must be above 0")
        out.append(rate)
    return out
