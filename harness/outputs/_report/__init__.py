"""The run report: one self-contained ``report.html`` per run folder.

:func:`write_report` reads a run folder (``harness.outputs._report._data``), draws the
per-request swimlane (``_swimlane``), the timelines and the CDFs with plotly (``_plots``) and
fills ``report.html.j2`` (jinja2). The page inlines plotly.js and its CSS, so it opens without
network.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from harness.analysis import is_plan_folder
from harness.outputs._format import fmt_number
from harness.outputs._matrix import (
    WASTED_TITLE,
    abort_level,
    abort_text,
    matrix_grid,
    ratio_text,
    wasted_text,
)
from harness.outputs._report._data import (
    ReportError,
    RunData,
    events,
    itl_ms,
    load_run,
    load_sockets,
    ok_metrics,
    run_start,
    slowest_connections,
    ttft_ms,
    user_classes,
)
from harness.outputs._report._plan import render_plan_report
from harness.outputs._report._plots import (
    cdf_figure,
    class_cdfs,
    fragment,
    hops_timeline,
    plotly_js,
    swimlane_figure,
    timeline,
)
from harness.outputs._report._suite_page import render_suite_report
from harness.outputs._report._swimlane import swimlane
from harness.runfolder import SUITE_JSON, MatrixCell
from zwcore import RunFolderError

__all__ = [
    "REPORT_NAME", "ReportError", "RunData", "cdf_figure", "fragment", "itl_ms", "load_run",
    "plotly_js", "render_report", "report_or_warning", "ttft_ms", "user_classes", "write_report",
]  # fmt: skip

REPORT_NAME = "report.html"
_STATUS_CSS = {"held": "bad", "none": "good", "not_observed": "warn"}


def _num(value: Any) -> str:
    return "-" if isinstance(value, jinja2.Undefined) else fmt_number(value)


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
        autoescape=True,  # fields missing from an older summary.json render as "-"
    )
    env.filters["num"] = _num
    return env


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Nested dicts as ``(dotted.key, value)`` pairs; lists of numbers or strings joined with
    ", ", other lists as compact JSON."""
    if isinstance(value, dict):
        pairs: list[tuple[str, Any]] = []
        for k, v in value.items():
            pairs += flatten(v, f"{prefix}.{k}" if prefix else str(k))
        return pairs
    if isinstance(value, list):
        if not value:
            return [(prefix, "-")]
        if all(isinstance(v, int | float | str) for v in value):
            return [(prefix, ", ".join(fmt_number(v) for v in value))]
        return [(prefix, json.dumps(value, default=str))]
    return [(prefix, value)]


def _verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, verdict in (summary.get("verdicts") or {}).items():
        if not isinstance(verdict, dict):
            verdict = {"value": verdict}
        status = str(verdict.get("status", ""))
        rest = {k: v for k, v in verdict.items() if k not in ("line", "status")}
        out.append({
            "title": name.replace("_", " "), "status": status or "-",
            "css": _STATUS_CSS.get(status, ""), "line": verdict.get("line"),
            "numbers": flatten(rest),
        })  # fmt: skip
    return out


def _scenario_text(data: RunData) -> str:
    path = data.run_dir / "scenario.toml"
    if path.exists():
        return path.read_text(errors="replace")
    return json.dumps(data.info.get("scenario", {}), indent=2)


# summary.json keys that have their own section; any other key is listed generically.
_KNOWN = {"scenario", "status", "failure", "duration_s", "groups", "server", "verdicts",
          "client_saturation", "matrix"}  # fmt: skip


def _matrix(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The disconnect matrix's grids for the template: rows of ``(text, level)`` per table."""
    cells = [MatrixCell.model_validate(c) for c in summary.get("matrix") or []]
    if not cells:
        return None
    g = matrix_grid(cells)

    def rows(text: Callable[[MatrixCell], str], heat: bool) -> list[tuple[str, list[Any]]]:
        return [
            (p, [(text(c), abort_level(c) if heat else None) if (c := g.cells[p].get(h)) else
                 ("-", None) for h in g.leaves])
            for p in g.phases
        ]  # fmt: skip

    return {
        "leaves": g.leaves,
        "tables": [
            ("leave to engine abort, ms p50 / max (aborted/left)", rows(abort_text, True)),
            (WASTED_TITLE, rows(wasted_text, False)),
            ("victims' TTFT p99, x control window", rows(ratio_text, False)),
        ],
        "control": g.control,
    }


def _context(data: RunData) -> dict[str, Any]:
    s, info = data.summary, data.info
    groups = [g for g in s.get("groups", []) if isinstance(g, dict)]
    outcomes = sorted({o for g in groups for o in g.get("outcomes", {})})
    skip = {"group", "user_class", "requests", "outcomes"}
    group_fields = list(dict.fromkeys(k for g in groups for k in g if k not in skip))
    server = flatten(s.get("server") or {})
    commands = []
    for name in ("target", "proxy"):
        argv = (info.get(name) or {}).get("argv")
        if argv:
            commands.append((name, shlex.join(map(str, argv))))
    for load in info.get("load_processes", []):
        commands.append((f"load {load.get('group')}", shlex.join(map(str, load.get("argv", [])))))
    measured = not (ok_metrics(data).empty and data.sockets.empty and data.requests.empty)
    answered = "ttft_ms" in data.requests and data.requests["ttft_ms"].notna().any()
    ttft, itl = class_cdfs(data)
    lanes = swimlane(data)
    phases = [e for e in events(data) if e.kind == "phase"]
    hops_fig = hops_timeline(data, [e.s for e in phases])
    proxy = dict(s.get("proxy") or {})
    hops = [h for h in proxy.pop("hops", None) or [] if isinstance(h, dict)]
    other = {k: (proxy if k == "proxy" else v) for k, v in s.items() if k not in _KNOWN}
    scenario = info.get("scenario") or {}
    return {
        "title": f"zerowindow report: {data.label}",
        "description": scenario.get("description", ""),
        "status": s.get("status", info.get("status", "?")),
        "failure": s.get("failure"),
        "started": info.get("started_utc"),
        "duration_s": s.get("duration_s"),
        "run_dir": str(data.run_dir),
        "verdicts": _verdicts(s),
        "matrix": _matrix(s),
        "gates": [g for g in data.gates.get("gates", []) if isinstance(g, dict)],
        "baseline": data.gates.get("baseline"),
        "exit_code": info.get("exit_code"),
        "saturation": s.get("client_saturation") or {},
        "startup_s": None if (t := run_start(data)) is None else data.t0 - t,
        "phases": phases,
        "swimlane": Markup(fragment(swimlane_figure(lanes, [e.s for e in phases]), "swimlane"))
        if lanes.labels
        else None,
        "lanes": lanes,
        "hops": hops,
        "hops_timeline": Markup(fragment(hops_fig, "hops-timeline")) if hops_fig else None,
        "n_slowest": len(slowest_connections(load_sockets(data))),
        "timeline": Markup(fragment(timeline(data), "timeline")) if measured else None,
        "ttft_cdf": Markup(fragment(ttft, "ttft-cdf")) if answered else None,
        "itl_cdf": Markup(fragment(itl, "itl-cdf")) if answered else None,
        "groups": groups,
        "outcomes": outcomes,
        "group_fields": group_fields,
        "server": server,
        "other": [(k, flatten(v)) for k, v in other.items()],
        "versions": list((info.get("versions") or {}).items()),
        "host": list((info.get("host") or {}).items()) + _accelerator(info.get("accelerator")),
        "commands": commands,
        "scenario_text": _scenario_text(data),
        "zw_version": (info.get("versions") or {}).get("zerowindow", "?"),
        "plotly_js": Markup(plotly_js()),
    }


def _accelerator(facts: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The host table's ``accelerator`` row from ``run.json``'s ``accelerator``: its GPUs and
    driver, or why there are none (no row for a run folder from before it was recorded)."""
    if not isinstance(facts, dict):
        return []
    if not facts.get("present"):
        return [("accelerator", f"none ({facts.get('reason')})")]
    gpus = ", ".join(
        f"{g.get('index')}: {g.get('name')} ({g.get('memory_total_bytes', 0) / 2**30:.1f} GiB)"
        for g in facts.get("gpus", [])
    )
    return [("accelerator", f"{gpus}; NVIDIA driver {facts.get('driver')}")]


def render_report(run_dir: Path) -> str:
    """The report of ``run_dir`` as one HTML page: a run's, a plan's
    (``harness.outputs._report._plan``) or a suite's (``_suite_page``). Raises
    :class:`ReportError` when the folder cannot be read (see
    :func:`harness.outputs._report._data.load_run`)."""
    try:
        if (run_dir / SUITE_JSON).is_file():
            return render_suite_report(run_dir)
        if is_plan_folder(run_dir):
            return render_plan_report(run_dir)
    except RunFolderError as exc:
        raise ReportError(str(exc)) from None
    return _env().get_template("report.html.j2").render(_context(load_run(run_dir)))


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the report of ``run_dir`` to ``out`` (default ``run_dir/report.html``) and return
    its path. Raises :class:`ReportError` (unreadable run folder) or ``OSError`` (cannot write)."""
    html = render_report(run_dir)
    path = out or run_dir / REPORT_NAME
    path.write_text(html, encoding="utf-8")
    return path


def report_or_warning(run_dir: Path) -> str | None:
    """Write ``run_dir/report.html``; return ``None``, or a one-line warning when that failed
    for any reason (the end of a run must not fail because of its report)."""
    try:
        write_report(run_dir)
    except KeyboardInterrupt:  # Ctrl-C while rendering: the results are already written
        return f"warning: {REPORT_NAME} not written: interrupted"
    except Exception as exc:  # noqa: BLE001 - the run's results are already written
        return f"warning: {REPORT_NAME} not written: {type(exc).__name__}: {exc}"
    return None
