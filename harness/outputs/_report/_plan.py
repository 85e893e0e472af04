"""The report of a plan's folder (repeats, control runs, a comparison, a sweep): one
self-contained ``report.html`` beside the runs' own, from the files the plan's conclusion wrote
(``plan.json``, ``gates.json``, each configuration's ``repeats.json``, ``comparison.json``,
``sweep.json``) and, for the distributions, the runs' tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.analysis import PlanRecord, read_plan, read_summary
from harness.outputs._format import fmt_number
from harness.outputs._repeats import impact_lines, interval_text, shown_figures
from harness.outputs._report._plots import plotly_js
from harness.runfolder import (
    COMPARISON_JSON,
    GATES_JSON,
    REPEATS_JSON,
    SWEEP_JSON,
    read_json,
)
from zwcore import RunFolderError


def _gates(folder: Path, record: PlanRecord) -> list[dict[str, Any]]:
    """Every configuration's gates, each with its configuration's name (``arm``)."""
    out: list[dict[str, Any]] = []
    for arm in record.plan.arms:
        where = folder / arm.folder / GATES_JSON if arm.folder else folder / GATES_JSON
        entries = record.of_arm(arm)
        if not where.exists() and entries:  # an arm of one run: the run's own gates
            where = folder / entries[0].path / GATES_JSON
        if where.exists():
            out += [{**g, "arm": arm.name} for g in read_json(where).get("gates", [])]
    return out


def _arms(folder: Path, record: PlanRecord) -> list[dict[str, Any]]:
    """Each pooled configuration's figures with their intervals (its ``repeats.json``)."""
    out = []
    for arm in record.plan.arms:
        path = (folder / arm.folder if arm.folder else folder) / REPEATS_JSON
        if not path.exists():
            continue
        rep = read_json(path)
        figures = rep.get("figures", {})
        gates = read_json(path.with_name(GATES_JSON)).get("gates", [])
        rows = [
            [name, interval_text(figures[name]), str(figures[name].get("method")),
             ", ".join(fmt_number(v, 1) for v in figures[name].get("per_repeat", []))]
            for name in shown_figures(figures, [g["figure"] for g in gates])
        ]  # fmt: skip
        title = arm.name if record.plan.kind == "comparison" else record.plan.scenario.name
        out.append({
            "title": f"{title}: figures over its runs", "repeats": rep.get("repeats"),
            "rows": rows, "impact": impact_lines(rep.get("impact") or {}),
        })  # fmt: skip
    return out


def _comparison(folder: Path) -> dict[str, Any]:
    """The comparison's tables, verdicts and the runs' distributions overlaid."""
    from harness.outputs._compare import compare_runs, figure_page_parts
    from harness.outputs._comparison import CONFIG_HEADERS, GROUP_HEADERS, table_rows

    path = folder / COMPARISON_JSON
    if not path.exists():
        return {}
    data = read_json(path)
    spans = data.get("intervals") or {}
    tables = []
    for key, headers in (("groups", GROUP_HEADERS), ("configurations", CONFIG_HEADERS)):
        rows = data.get(key, [])
        cols = list(rows[0]) if rows else []
        cells = table_rows([[r[c] for c in cols] for r in rows])
        for raw, line in zip(rows, cells, strict=True):
            mine = spans.get(str(raw.get("configuration")), {}) if key == "groups" else {}
            for i, col in enumerate(cols):
                if (s := mine.get(f"{raw.get('group')}.{col}")) and line[i] != "-":
                    line[i] += f" [{fmt_number(s[0], 1)}, {fmt_number(s[1], 1)}]"
        tables.append({"header": [headers.get(c, c) for c in cols], "rows": cells})
    parts = figure_page_parts(compare_runs([folder]))
    return {
        "comparison": tables,
        "distortion": [d["line"] for d in data.get("distortion", [])],
        **parts,
    }


def render_plan_report(folder: Path) -> str:
    """The report of the plan in ``folder`` as one HTML page. Raises
    :class:`~zwcore.RunFolderError` for a folder whose files cannot be read."""
    from harness.outputs._sweep import sweep_fragment

    record = read_plan(folder)
    plan, info = record.plan, record.info
    runs = []
    for e in record.runs:
        try:
            status = read_summary(folder / e.path).status
        except RunFolderError:
            status = "no summary"
        runs.append({"path": e.path, "status": status})
    context: dict[str, Any] = {
        "title": f"zerowindow {plan.kind}: {plan.scenario.name}",
        "description": plan.scenario.description,
        "kind": plan.kind,
        "exit_code": info.get("exit_code"),
        "failure": info.get("failure"),
        "started": info.get("started_utc"),
        "run_dir": folder,
        "confidence": plan.confidence,
        "draws": plan.bootstrap_draws,
        "runs": runs,
        "gates": _gates(folder, record),
        "many_arms": len(plan.arms) > 1,
        "arms": _arms(folder, record),
        "zw_version": (info.get("versions") or {}).get("zerowindow", "?"),
        "plotly_js": Markup(plotly_js()),
    }
    if plan.kind == "comparison":
        context.update(_comparison(folder))
    if (folder / SWEEP_JSON).exists():
        context["sweep"] = Markup(sweep_fragment(read_json(folder / SWEEP_JSON)))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
                             autoescape=True)  # fmt: skip
    return env.get_template("plan.html.j2").render(context)
