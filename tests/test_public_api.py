"""The public façade: every exported name resolves, the façade re-exports its subpackages'
names unchanged, and the pytest plugin and docs can rely on them."""

from __future__ import annotations

import importlib

import pytest

import harness

PACKAGES = ["zwcore", "loadgen", "netem", "harness"] + [
    f"harness.{role}"
    for role in (
        "scenario", "servers", "collectors", "lifecycle", "runfolder", "analysis", "gates",
        "outputs",
    )
]  # fmt: skip


@pytest.mark.parametrize("name", PACKAGES)
def test_every_exported_name_resolves(name):
    module = importlib.import_module(name)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "a name is exported twice"
    # loadgen's Locust-bound names are resolved in a subprocess: Locust monkey-patches the
    # process that imports it (tests/conftest.py stops the session if that happens here)
    locust_bound = set(getattr(module, "_LAZY", {})) if name == "loadgen" else set()
    missing = [n for n in exported if n not in locust_bound and getattr(module, n, None) is None]
    assert not missing, f"{name}.__all__ names what it does not define: {missing}"


def test_loadgens_locust_bound_names_resolve():
    import subprocess
    import sys

    code = "import loadgen\nfor n in loadgen._LAZY:\n    assert getattr(loadgen, n), n\n"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_the_facade_re_exports_the_same_objects():
    for name in harness.__all__:
        obj = getattr(harness, name)
        home = getattr(obj, "__module__", None)
        if home and home.startswith("harness."):
            role = ".".join(home.split(".")[:2])
            assert getattr(importlib.import_module(role), name, obj) is obj, name
    assert set(harness.__all__) <= set(dir(harness))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        harness.no_such_name  # noqa: B018
