"""Scenario files: TOML read, overrides merged, validated into a :class:`Scenario`, and every
problem located at its file, line and field."""

from __future__ import annotations

import difflib
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.scenario._models import Scenario
from loadgen import UserGroupConfig
from zwcore import ScenarioError, load_plugins, relocated_errors, resolve_plugins


def _find_line(lines: list[str], loc: tuple[int | str, ...]) -> int | None:
    """Best-effort line number (1-based) of the field at ``loc`` in a TOML text."""
    pos, line_no, table = 0, None, ""
    for part in loc:
        if isinstance(part, int):
            header = re.compile(rf"^\s*\[\[\s*{re.escape(table)}\s*\]\]")
            seen = -1
            for i in range(len(lines)):
                if header.match(lines[i]):
                    seen += 1
                    if seen == part:
                        pos, line_no = i + 1, i + 1
                        break
            else:
                return line_no
            continue
        table = f"{table}.{part}" if table else part
        key = re.compile(
            rf"^\s*(\[\[?\s*([\w.-]*\.)?{re.escape(part)}\s*\]\]?|{re.escape(part)}\s*=)"
            rf"|[{{,]\s*{re.escape(part)}\s*="
        )
        for i in range(pos, len(lines)):
            if key.search(lines[i]):
                pos, line_no = i, i + 1
                break
    return line_no


def _find_text(lines: list[str], start: int, text: str) -> int | None:
    """The first line (1-based) from line ``start`` on that holds the TOML string ``text``."""
    quoted = [f'"{text}"', f"'{text}'", text]
    for i in range(start - 1, len(lines)):
        if any(q in lines[i] for q in quoted):
            return i + 1
    return None


def _group_names(text: str) -> list[Any]:
    """The ``name`` of each ``[[groups]]`` entry of the TOML ``text`` (``None`` where absent);
    ``[]`` when the text is not TOML or has no groups list."""
    try:
        groups = tomllib.loads(text).get("groups")
    except tomllib.TOMLDecodeError:
        return []
    if not isinstance(groups, list):
        return []
    return [g.get("name") if isinstance(g, dict) else None for g in groups]


def _format_errors(path: Path, text: str, error: ValidationError) -> str:
    lines = text.splitlines()
    group_names = _group_names(text)
    out = []
    errors = relocated_errors(error)
    if any(e["loc"][:1] == ("matrix",) for e in errors):
        # The matrix makes the groups; one that does not validate makes none, and "groups:
        # Field required" would blame a table the file does not need.
        errors = [e for e in errors if not (e["loc"] == ("groups",) and e["type"] == "missing")]
    for err in errors:
        raw = err["loc"]
        # proxies[i].proxy.x: in the file, the proxy's fields sit in the entry itself
        loc = tuple(
            p for i, p in enumerate(raw) if not (i > 1 and p == "proxy" and raw[i - 2] == "proxies")
        )
        ctx = err.get("ctx") or {}
        if "gate_index" in ctx:  # a gate's error raised for the whole list: point at the gate
            loc = (*loc, ctx["gate_index"])
            err["input"] = ctx["gate"]
        field = ".".join(str(p) for p in loc) or "(top level)"
        label = f"'{field}'"
        if len(loc) > 1 and loc[0] == "groups" and isinstance(loc[1], int):
            name = group_names[loc[1]] if loc[1] < len(group_names) else None
            if isinstance(name, str):
                label += f" (group {name!r})"
        # A missing field is not in the text: point at the table that lacks it.
        line = _find_line(lines, loc[:-1] if err["type"] == "missing" else loc)
        if loc and isinstance(loc[-1], int) and isinstance(err.get("input"), str) and line:
            # An item of an inline array: the line that holds its text.
            line = _find_text(lines, line, err["input"]) or line
        where = f"{path}:{line}" if line else str(path)
        got = ""
        if (
            err["type"] not in ("missing", "gate_syntax", "unknown_figure")
            and "input" in err
            and not isinstance(err["input"], dict | list)
        ):
            got = f" (got {err['input']!r})"
        out.append(f"{where}: field {label}: {err['msg']}{got}{_did_you_mean(err, loc)}")
    return "\n".join(out)


def _did_you_mean(err: Any, loc: tuple[Any, ...]) -> str:
    """For a misspelt field of the scenario itself or of a group: the field meant."""
    if err["type"] != "extra_forbidden" or not loc:
        return ""
    if len(loc) == 1:
        fields = list(Scenario.model_fields)
    elif len(loc) == 3 and loc[0] == "groups":
        fields = list(UserGroupConfig.model_fields)
    else:
        return ""
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _merge(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``data`` with ``overrides`` merged in: tables merge key by key, other values replace."""
    out = dict(data)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_scenario(
    text: str, *, path: Path, overrides: Mapping[str, Any] | None = None
) -> Scenario:
    """Validate the TOML ``text`` of the scenario file ``path``, with ``overrides`` (nested
    tables as dicts, e.g. ``{"target": {"engine": {"kv_release": "on_finish"}}}``) merged in
    first.

    Raises :class:`ScenarioError` naming file, line and field for TOML syntax errors and for
    every validation problem.
    """
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML: {exc}") from None
    if overrides:
        data = _merge(data, overrides)
    _load_plugins(data, path=path, text=text)
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise ScenarioError(_format_errors(path, text, exc)) from None


def _load_plugins(data: dict[str, Any], *, path: Path, text: str) -> None:
    """Import the scenario's ``plugins`` (file paths resolved against its folder, in
    ``data``), so that the kinds they register validate. Raises :class:`ScenarioError` at the
    ``plugins`` line."""
    plugins = data.get("plugins", [])
    line = _find_line(text.splitlines(), ("plugins",))
    where = f"{path}:{line}" if line else str(path)
    if not isinstance(plugins, list) or not all(isinstance(p, str) for p in plugins):
        raise ScenarioError(f"{where}: field 'plugins': a list of module names or .py files")
    data["plugins"] = resolve_plugins(plugins, path.parent)
    try:
        load_plugins(data["plugins"])
    except ScenarioError as exc:
        raise ScenarioError(f"{where}: field 'plugins': {exc}") from None


def load_scenario(path: str | Path, *, overrides: Mapping[str, Any] | None = None) -> Scenario:
    """Read and validate a scenario file (``overrides``: see :func:`parse_scenario`).

    Raises :class:`ScenarioError` (see :func:`parse_scenario`), also when the file cannot be read.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the scenario file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"{path}: not a UTF-8 text file (byte {exc.start}: {exc.reason})"
        ) from None
    return parse_scenario(text, path=path, overrides=overrides)
