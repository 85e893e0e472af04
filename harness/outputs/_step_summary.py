"""A run as GitHub-flavoured Markdown, appended to the file ``$GITHUB_STEP_SUMMARY`` names.

GitHub Actions renders that file on the workflow run's summary page
(https://docs.github.com/en/actions/using-workflows/workflow-commands-for-github-actions,
"Adding a job summary"); it is appended to, so several runs in one job each add a section.
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.gates import GateResult
from harness.outputs._format import fmt_number as _f
from harness.runfolder import RunSummary

ENV = "GITHUB_STEP_SUMMARY"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def gate_mark(gate: GateResult) -> str:
    """The gate's sign in Markdown: skipped, passed with a warning (inconclusive), passed,
    failed."""
    if gate.skipped:
        return "⏭️"
    if gate.passed:
        return "⚠️" if gate.inconclusive else "✅"
    return "❌"


def step_summary_markdown(
    summary: RunSummary, gates: list[GateResult], *, run_dir: Path, exit_code: int
) -> str:
    """The Markdown section of one run: headline, gate table, per-group and server figures,
    the KV-held verdict and the run folder. Latencies in ms."""
    failed = [g for g in gates if not g.passed]
    if summary.status != "complete":
        head = f"run {summary.status}"
    elif failed:
        head = f"{len(failed)} of {len(gates)} gates failed"
    else:
        head = f"all {len(gates)} gates passed" if gates else "no gates declared"
    mark = "✅" if exit_code == 0 else "❌"
    out = [f"### {mark} zerowindow `{summary.scenario}`: {head} (exit {exit_code})", ""]
    if summary.failure:
        out += [f"> run {summary.status}: {_cell(summary.failure)}", ""]
    if gates:
        out += ["| | gate | measured | bound | reason |", "| --- | --- | ---: | ---: | --- |"]
        for g in gates:
            bound = "-" if g.bound is None else f"{g.op} {g.bound:.6g}"
            mark = gate_mark(g)
            out.append(
                f"| {mark} | `{_cell(g.gate)}` | {_f(g.measured, 2)} "
                f"| {bound} | {_cell(g.reason)} |"
            )
        out.append("")
    out += [
        "| group | requests | outcomes | TTFT p50 | TTFT p99 | ITL p50 | ITL p99 | tokens/s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for grp in summary.groups:
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(grp.outcomes.items()))
        out.append(
            f"| {grp.group} | {grp.requests} | {outcomes} | {_f(grp.ttft_p50_ms, 1)} "
            f"| {_f(grp.ttft_p99_ms, 1)} | {_f(grp.itl_p50_ms, 2)} | {_f(grp.itl_p99_ms, 2)} "
            f"| {_f(grp.output_tokens_per_s, 1)} |"
        )
    s = summary.server
    out += [
        "",
        "Latencies in ms. Server: peak KV usage "
        f"{_f(s.kv_cache_usage_peak_perc, 1)} %, preemptions {_f(s.preemptions, 0)}, "
        f"peak running {_f(s.running_peak, 0)}, peak waiting {_f(s.waiting_peak, 0)}.",
        "",
    ]
    verdict = summary.verdicts.get("kv_held_by_undelivered_streams", {}).get("line")
    if verdict:
        out += [_cell(str(verdict)), ""]
    if summary.client_saturation.saturated:
        out += [f"**{_cell(summary.client_saturation.message)}**", ""]
    out += [f"Run folder: `{run_dir}`", "", ""]
    return "\n".join(out)


def append_step_summary(
    summary: RunSummary,
    gates: list[GateResult],
    *,
    run_dir: Path,
    exit_code: int,
    path: str | None = None,
) -> Path | None:
    """Append :func:`step_summary_markdown` to ``path`` (default: ``$GITHUB_STEP_SUMMARY``).
    Returns the file written, or ``None`` when no file is named. Raises ``OSError`` if the
    file cannot be appended to."""
    markdown = step_summary_markdown(summary, gates, run_dir=run_dir, exit_code=exit_code)
    return append_markdown(markdown, path=path)


def append_markdown(markdown: str, *, path: str | None = None) -> Path | None:
    """Append ``markdown`` to ``path`` (default: ``$GITHUB_STEP_SUMMARY``); the file written,
    or ``None`` when no file is named. Raises ``OSError`` if it cannot be appended to."""
    target = path if path is not None else os.environ.get(ENV)
    if not target:
        return None
    with open(target, "a", encoding="utf-8") as f:
        f.write(markdown)
    return Path(target)


def append_setup_error(
    scenario: Path, title: str, detail: str, *, path: str | None = None
) -> Path | None:
    """Append a section saying that ``zerowindow run SCENARIO`` stopped before it started
    (``title``: what went wrong, ``detail``: the error text) to ``path`` (default:
    ``$GITHUB_STEP_SUMMARY``). Returns the file written, or ``None`` when no file is named.
    Raises ``OSError`` if the file cannot be appended to."""
    target = path if path is not None else os.environ.get(ENV)
    if not target:
        return None
    fenced = detail.replace("```", "'''")
    text = f"### ❌ zerowindow `{scenario}`: {_cell(title)} (exit 2)\n\n```\n{fenced}\n```\n\n"
    with open(target, "a", encoding="utf-8") as f:
        f.write(text)
    return Path(target)
