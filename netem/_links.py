"""Network profiles of a scenario's groups: names resolved to link profiles.

A group's ``network_profile`` is ``"none"`` (an unshaped link of its own when the run builds a
topology), the name of a built-in preset (:data:`netem._profiles.PRESETS`) or the name of a
profile the scenario defines in ``[netem.profiles.<name>]`` (a table of
:class:`~netem._profiles.LinkProfile` fields, or ``preset = "3g"`` plus overrides, see
:func:`netem._profiles.resolve_profile`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from netem._errors import NetemError
from netem._profiles import PRESETS, LinkProfile, UnknownPreset
from netem._profiles import resolve_profile as _resolve

NONE = "none"


def _errors(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(table)'}: {e['msg']}" for e in exc.errors()
    )


def check_profiles(custom: dict[str, dict[str, Any]]) -> list[str]:
    """Problems with the scenario's own profiles (``[netem.profiles]``), one message each;
    empty when all is well. A group's profile name is checked by :func:`unknown_profile`."""
    problems = []
    for name, fields in custom.items():
        if name == NONE or name in PRESETS:
            problems.append(f"netem.profiles.{name}: the name of a built-in profile")
            continue
        try:
            _resolve(fields)
        except UnknownPreset as exc:
            problems.append(f"netem.profiles.{name}: {exc}")
        except ValidationError as exc:
            problems.append(f"netem.profiles.{name}: {_errors(exc)}")
    return problems


def unknown_profile(name: str, custom: Mapping[str, Any]) -> str | None:
    """``"unknown network_profile 'x'; valid: ..."`` when ``name`` is neither ``none``, a
    preset nor one of the scenario's ``custom`` profiles; None when it is known."""
    if name == NONE or name in PRESETS or name in custom:
        return None
    valid = ", ".join(sorted([NONE, *PRESETS, *custom]))
    return f"unknown network_profile {name!r}; valid: {valid}"


def resolve_group_profile(name: str, custom: dict[str, dict[str, Any]]) -> LinkProfile | None:
    """The link profile called ``name`` (``None`` for ``"none"``). Raises ``KeyError`` for an
    unknown name, pydantic's ``ValidationError`` for a bad custom profile."""
    if name == NONE:
        return None
    if name in custom:
        profile = _resolve(custom[name])
        return profile if profile.name else profile.model_copy(update={"name": name})
    if name not in PRESETS:
        raise KeyError(name)
    return PRESETS[name]


# The name callers have imported it by (it is exported from ``netem`` as resolve_group_profile,
# since ``netem.resolve_profile`` is :func:`netem._profiles.resolve_profile`).
resolve_profile = resolve_group_profile


def profile_argument(text: str) -> LinkProfile:
    """The link profile a command line names: a preset (``3g``), a TOML file holding one
    profile table (``link.toml``: ``preset``, ``down``, ``up`` as in ``[netem.profiles.X]``),
    or a profile of a scenario's ``[netem.profiles]`` (``scenario.toml:NAME``; the name may
    be left out when the file defines one). Raises :class:`~netem._errors.NetemError` naming
    the file and the problem (unreadable, not TOML, no such profile, a bad field), or
    :class:`UnknownPreset`."""
    path_text, sep, name = text.partition(".toml:")
    if not sep and not text.endswith(".toml"):
        return _resolve(text)
    path = Path(path_text + ".toml" if sep else text)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NetemError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise NetemError(f"{path}: not TOML: {exc}") from None
    profiles = (
        data.get("netem", {}).get("profiles") if isinstance(data.get("netem"), dict) else None
    )
    where = str(path)
    if isinstance(profiles, dict):
        if not name and len(profiles) == 1:
            name = next(iter(profiles))
        if name not in profiles:
            valid = ", ".join(sorted(profiles)) or "none"
            raise NetemError(f"{path}: name a profile of [netem.profiles] as {path}:NAME ({valid})")
        data, where = profiles[name], f"{path}: netem.profiles.{name}"
    elif name:
        raise NetemError(f"{path} has no [netem.profiles] table to take {name!r} from")
    try:
        profile = _resolve(data)
    except ValidationError as exc:
        raise NetemError(f"{where}: {_errors(exc)}") from None
    return profile if profile.name else profile.model_copy(update={"name": name or path.stem})
