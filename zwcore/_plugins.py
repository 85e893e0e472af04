"""Plugins: modules that register kinds of their own (docs/extending.md).

A scenario names them in ``plugins``: a module name (``"mycompany.zw_kinds"``, found on
``sys.path``) or the path of a Python file (``"kinds/burst.py"``, relative to the scenario's
folder; its own folder is appended to ``sys.path``, so it can import the modules beside it).
Each is imported once per process, before the scenario is validated, in the harness
and in every Locust process the run starts, so a kind registered there (a read behaviour, an
action, a target, a proxy, a shaping backend) is known wherever the scenario is read.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from zwcore._errors import ScenarioError


def is_file_plugin(spec: str) -> bool:
    """Whether ``spec`` names a Python file (ends in ``.py``) rather than a module."""
    return spec.endswith(".py")


def resolve_plugins(specs: Iterable[str], base: Path) -> list[str]:
    """``specs`` with every file path made absolute against ``base`` (module names as given)."""
    return [str((base / s).resolve()) if is_file_plugin(s) else s for s in specs]


def load_plugins(specs: Iterable[str]) -> list[ModuleType]:
    """Import each plugin of ``specs`` (module names, or absolute paths of ``.py`` files; see
    :func:`resolve_plugins`), once per process. Raises :class:`ScenarioError` naming the
    plugin for one that is missing or fails to import (with the error it raised)."""
    modules = []
    for spec in specs:
        try:
            modules.append(_load_file(Path(spec)) if is_file_plugin(spec) else _load_module(spec))
        except ScenarioError:
            raise
        except (Exception, SystemExit) as exc:  # user code: whatever it raises is reported
            raise ScenarioError(
                f"plugin {spec!r} failed to import: {type(exc).__name__}: {exc}"
            ) from None
    return modules


def _load_module(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise ScenarioError(f"plugin {name!r}: no such module on sys.path") from None
        raise


def _load_file(path: Path) -> ModuleType:
    # One module per file, named after its path, so a second load (e.g. from run.json) is the
    # same module and registers nothing twice.
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
    name = f"zerowindow_plugin_{path.stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    if not path.is_file():
        raise ScenarioError(f"plugin {str(path)!r}: no such file")
    if str(path.parent) not in sys.path:  # so that it can import the modules beside it
        sys.path.append(str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ScenarioError(f"plugin {str(path)!r}: cannot be imported")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
