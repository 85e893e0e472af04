"""Network profiles of a scenario's groups: names resolved to link profiles.

A group's ``network_profile`` is ``"none"`` (an unshaped link), the name of a built-in
preset (:mod:`netem._profiles`) or the name of a profile the scenario defines in
``[netem.profiles.<name>]``.
"""

from __future__ import annotations

from typing import Any

NONE = "none"


def _presets() -> dict[str, Any]:
    try:
        from netem._profiles import PRESETS
    except ImportError:  # link shaping not available in this build
        return {}
    return dict(PRESETS)


def _build(fields: dict[str, Any]) -> Any:
    from netem._profiles import LinkProfile

    return LinkProfile(**fields)


def check_profiles(groups: dict[str, str], custom: dict[str, dict[str, Any]]) -> list[str]:
    """Problems with the groups' profile names (``{group: profile name}``) and the
    scenario's own profiles, one message each; empty when all is well."""
    problems = []
    presets = _presets()
    for name, fields in custom.items():
        if name == NONE or name in presets:
            problems.append(f"netem.profiles.{name}: the name of a built-in profile")
            continue
        try:
            _build(fields)
        except ImportError:
            problems.append(f"netem.profiles.{name}: link shaping is not available")
        except Exception as exc:  # a validation error: name the profile
            problems.append(f"netem.profiles.{name}: {exc}")
    for group, name in groups.items():
        if name != NONE and name not in presets and name not in custom:
            valid = ", ".join(sorted([NONE, *presets, *custom]))
            problems.append(f"group {group}: unknown network_profile {name!r}; valid: {valid}")
    return problems


def resolve_profile(name: str, custom: dict[str, dict[str, Any]]) -> Any | None:
    """The link profile called ``name`` (``None`` for ``"none"``). Raises ``KeyError`` for an
    unknown name."""
    if name == NONE:
        return None
    if name in custom:
        return _build(custom[name])
    return _presets()[name]
