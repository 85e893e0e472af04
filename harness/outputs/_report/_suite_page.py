"""The report of a suite's folder: one row per incident and per matrix cell, from the cases its
``suite.json`` keeps (``harness.lifecycle._suite``), each incident linked to its own report."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2

from harness.runfolder import SUITE_JSON, read_json
from zwcore import RunFolderError


def render_suite_report(folder: Path) -> str:
    """The suite in ``folder`` as one HTML page. Raises :class:`~zwcore.RunFolderError` for a
    ``suite.json`` without its cases (a suite that has not ended)."""
    record = read_json(folder / SUITE_JSON)
    if "cases" not in record:
        raise RunFolderError(f"{folder / SUITE_JSON}: no cases (the suite has not ended)")
    incidents = [e for e in record["incidents"] if e.get("folder")]
    links = {e["name"]: f"{e['folder']}/report.html" for e in incidents}
    cases: list[dict[str, Any]] = [{**c, "link": links.get(c["name"])} for c in record["cases"]]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(__file__).parent)),
                             autoescape=True)  # fmt: skip
    return env.get_template("suite.html.j2").render(
        folder=folder, cases=cases, passed=sum(c["passed"] for c in cases),
        exit_code=record.get("exit_code"), directory=record.get("directory"),
        target=record.get("target_url") or record.get("target"),
    )  # fmt: skip
