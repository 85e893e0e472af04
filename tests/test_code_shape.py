"""The code's shape: small modules and short functions in the toolkit's packages.

No module of ``zwcore``, ``loadgen``, ``netem`` or ``harness`` is over
:data:`MAX_MODULE_LINES` lines, and no function or method there is over
:data:`MAX_FUNCTION_LINES` (``end_lineno - lineno + 1`` of its ``def``, decorators excluded,
nested functions counted within their parent and on their own). A failure lists every
offender."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("zwcore", "loadgen", "netem", "harness")
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py"))


def _long_functions(path: Path, source: str) -> list[str]:
    """``path:line name (n lines)`` of each function or method over the limit."""
    found = []
    for node in ast.walk(ast.parse(source, filename=str(path))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            assert node.end_lineno is not None
            lines = node.end_lineno - node.lineno + 1
            if lines > MAX_FUNCTION_LINES:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_the_packages_are_found():
    assert len(_modules()) > 50


def test_no_module_is_over_the_line_limit():
    offenders = []
    for path in _modules():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_MODULE_LINES:
            offenders.append(f"{path.relative_to(REPO)} ({lines} lines)")
    assert not offenders, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(offenders)


def test_no_function_is_over_the_line_limit():
    offenders = []
    for path in _modules():
        offenders += _long_functions(path, path.read_text(encoding="utf-8"))
    assert not offenders, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(offenders)
