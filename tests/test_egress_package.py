"""The egress buffer subpackage stays self-contained (DESIGN.md: "the engine emulator and the
egress buffer as self-contained subpackages"): it imports only the standard library,
third-party packages, ``harness._model_options`` and ``zwcore``; its exception classes derive
from ``zwcore.ProxyError``; its modules say first what they are for."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import sys
from pathlib import Path

import harness._egress
import zwcore

PACKAGE = Path(harness._egress.__file__).parent
ALLOWED_FIRST_PARTY = {"harness._model_options", "zwcore"}
FIRST_PARTY = ("harness", "loadgen", "netem", "zwcore", "tests")


def _modules() -> list[str]:
    return sorted(f"harness._egress.{m.name}" for m in pkgutil.iter_modules([str(PACKAGE)]))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom):
            names.add("harness._egress")  # relative: inside the subpackage
    return names


def test_imports_stay_inside_the_allowed_set() -> None:
    bad: list[str] = []
    for path in sorted(PACKAGE.glob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            if top not in FIRST_PARTY or top in sys.stdlib_module_names:
                continue
            if name == "harness._egress" or name.startswith("harness._egress."):
                continue
            if not any(name == a or name.startswith(a + ".") for a in ALLOWED_FIRST_PARTY):
                bad.append(f"{path.name}: {name}")
    assert not bad, bad


def test_exception_classes_derive_from_proxy_error() -> None:
    found = []
    for name in _modules():
        module = importlib.import_module(name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == name and issubclass(cls, BaseException):
                found.append(cls)
                assert issubclass(cls, zwcore.ProxyError), cls
    assert found  # the test sees at least one (``_http.Refused``)


def test_every_module_starts_with_its_docstring() -> None:
    for path in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), path.name
