"""Docs that cannot go stale: every shell block of the tutorials and how-to guides (the site's
nav, mkdocs.yml) runs, and every TOML block of docs/ loads as a scenario, so a renamed option,
field or flag fails here.

Markers, an HTML comment on the line just before a block (the page says why in its text too):
``<!-- docs-test: skip: WHY -->`` a shell block that cannot run here (a GPU runner's, another
machine's), or a TOML block naming files of the reader's own (then only parsed as TOML);
``<!-- docs-test: file PATH -->`` a block the reader saves as PATH, written into the page's
folder before its shell blocks run; ``<!-- docs-test: fragment -->`` a TOML block that is part
of a scenario, loaded merged into a minimal one.

A page's shell blocks run in order, as one bash script (``set -e``: the first failing command
fails it), in a fresh folder holding ``scenarios/`` and ``models/``, with the venv's ``bin`` on
``PATH`` and this checkout first on ``PYTHONPATH``. A background job a page leaves running is
killed at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness.scenario import parse_scenario
from tests.conftest import REPO

DOCS = REPO / "docs"
_BLOCK = re.compile(
    r"(?:^<!-- docs-test: (?P<marker>[^>]*?) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.M | re.S,
)
# The scenario a TOML fragment is merged into.
_BASE = """name = "fragment"
[target]
kind = "sim"
served_model_name = "sim"
[[groups]]
name = "fast"
users = 1
requests_per_user = 1
[[groups]]
name = "stalled"
users = 1
requests_per_user = 1
"""


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    marker: str  # "" when unmarked

    @property
    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"


def blocks(page: str) -> list[Block]:
    text = (DOCS / page).read_text(encoding="utf-8")
    found = []
    for m in _BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("lang")) + 1
        found.append(Block(page, line, m["lang"], m["body"], m["marker"] or ""))
    return found


def _nav_pages(section: str) -> list[str]:
    nav = yaml.safe_load((REPO / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    [entries] = [item[section] for item in nav if isinstance(item, dict) and section in item]
    return [page for entry in entries for page in entry.values()]


RUN_PAGES = _nav_pages("Tutorials") + _nav_pages("How-to guides")
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
TOML_BLOCKS = [b for page in PAGES for b in blocks(page) if b.lang == "toml"]


def test_markers_are_known_and_each_marks_a_block():
    for page in PAGES:
        marked = [b for b in blocks(page) if b.marker]
        for b in marked:
            assert re.fullmatch(r"skip: .+|file \S+|fragment", b.marker), f"{b.where}: {b.marker}"
        text = (DOCS / page).read_text(encoding="utf-8")
        assert text.count("<!-- docs-test:") == len(marked), f"docs/{page}: a marker marks no block"


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=lambda b: b.where)
def test_toml_block_is_a_scenario(block: Block, tmp_path: Path) -> None:
    path = tmp_path / "doc.toml"
    if block.marker.startswith("skip:"):
        tomllib.loads(block.body)  # TOML at least
    elif block.marker == "fragment":
        parse_scenario(_BASE, path=path, overrides=tomllib.loads(block.body))
    else:
        parse_scenario(block.body, path=path)


def _script(page: str, folder: Path) -> str:
    lines = ["set -euo pipefail", "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT"]
    for b in blocks(page):
        if b.marker.startswith("file "):
            target = folder / b.marker.removeprefix("file ")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(b.body, encoding="utf-8")
        elif b.lang == "sh" and not b.marker.startswith("skip:"):
            lines += [f"echo '### {b.where}' >&2", b.body]
    return "\n".join(lines) + "\n"


LANES = 3  # pages run three at a time: their runs mostly wait (holds, start-up), on 2 CPUs


def _start(page: str, folder: Path) -> subprocess.Popen[str]:
    """Start ``page``'s commands as one bash script in ``folder`` (its output to files)."""
    script = _script(page, folder)
    for name in ("scenarios", "models"):
        (folder / name).symlink_to(REPO / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    out, err = (open(folder / f".{n}", "w") for n in ("stdout", "stderr"))  # noqa: SIM115
    return subprocess.Popen(["bash", "-c", script], cwd=folder, env=env, stdout=out, stderr=err,
                            text=True, start_new_session=True)  # fmt: skip


@pytest.fixture(scope="module")
def page_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str]]:
    """Every runnable page's exit code and output tail, run ``LANES`` at a time (the slowest
    first) within 300 s each."""
    results: dict[str, tuple[int, str]] = {}
    waiting = list(RUN_PAGES)
    running: dict[str, tuple[subprocess.Popen[str], Path, float]] = {}
    while waiting or running:
        while waiting and len(running) < LANES:
            page = waiting.pop(0)
            folder = tmp_path_factory.mktemp(page.removesuffix(".md"))
            running[page] = (_start(page, folder), folder, time.monotonic())
        for page, (proc, folder, t0) in list(running.items()):
            if proc.poll() is None and time.monotonic() - t0 < 300:
                continue
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            tail = "\n".join((folder / f".{n}").read_text()[-3000:] for n in ("stdout", "stderr"))
            results[page] = (proc.returncode, tail.strip())
            del running[page]
        time.sleep(0.1)
    return results


@pytest.mark.parametrize("page", RUN_PAGES)
def test_the_pages_commands_run(page: str, page_runs: dict[str, tuple[int, str]]) -> None:
    code, tail = page_runs[page]
    assert code == 0, f"docs/{page}: a command failed (exit {code}):\n{tail}"
