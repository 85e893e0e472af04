"""The scenario format, described from its models so that it cannot drift from them: a JSON
Schema of the scenario file (``zerowindow schema``), which editors that read JSON Schema for
TOML (taplo, Even Better TOML) use to complete and check fields, and the Markdown reference
``docs/scenarios.md`` (``zerowindow schema --markdown``; a test fails when the file is stale).

Kinds registered by plugins appear when their plugins were imported first.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from harness.scenario._models import Scenario
from zwcore import Registry

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
_OR = " \\| "  # "or" in a Markdown table cell


def scenario_json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of a scenario file: every table and field, each kind of
    a pluggable part as one of ``oneOf`` with its ``kind`` required
    (``zwcore.Registry.json_schema_variants``)."""
    return {"$schema": SCHEMA_DIALECT, **Scenario.model_json_schema()}


def _field_annotation(info: FieldInfo) -> Any:
    """The field's annotation with its metadata (pydantic keeps ``Annotated``'s metadata apart,
    and a registry field's kinds live there)."""
    if info.metadata:
        return typing.Annotated[(info.annotation, *info.metadata)]
    return info.annotation


def _inner_annotation(annotation: Any) -> tuple[Any, Registry[Any] | None]:
    """``annotation`` without ``Annotated`` (the registry found in its metadata, if any)."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *meta = typing.get_args(annotation)
        for m in meta:
            registry = getattr(m, "_registry", None)
            if isinstance(registry, Registry):
                return base, registry
        return base, None
    return annotation, None


def _type_text(annotation: Any) -> str:
    annotation, registry = _inner_annotation(annotation)
    if registry is not None:
        kinds = _OR.join(registry.kinds())
        return f"table ({registry.what}: `kind` = {kinds})"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return _OR.join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return _OR.join(_type_text(a) for a in args)
    if origin is list:
        return f"array of {_type_text(args[0])}" if args else "array"
    if origin is tuple:
        return f"array [{', '.join(_type_text(a) for a in args if a is not Ellipsis)}]"
    if origin is dict:
        return f"table of {_type_text(args[1])}" if len(args) == 2 else "table"
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return f"table ({annotation.__name__})"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", type(None): "none"}
    if annotation in names:
        return names[annotation]
    return getattr(annotation, "__name__", str(annotation))


def _default_text(info: FieldInfo) -> str:
    if info.default_factory is not None:
        value = info.default_factory()  # type: ignore[call-arg]
    elif info.default is PydanticUndefined:
        return "required"
    else:
        value = info.default
    if isinstance(value, BaseModel):
        return "(table)"
    try:
        return f"`{json.dumps(value)}`"
    except TypeError:
        return f"`{value!s}`"


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's values are made of (a registry's registered ones included)."""
    annotation, registry = _inner_annotation(annotation)
    if registry is not None:
        return [m for m in registry.models() if inspect.isclass(m) and issubclass(m, BaseModel)]
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for a in typing.get_args(annotation) for m in _models_in(a)]


def _doc(model: type[BaseModel]) -> str:
    """A model's docstring as Markdown: each paragraph on one line, a reST literal block (the
    indented paragraph after one ending ``::``) as a fenced code block."""
    out: list[str] = []
    literal = False
    for paragraph in (inspect.getdoc(model) or "").split("\n\n"):
        if literal and paragraph.startswith((" ", "\t")):
            out.append("```\n" + textwrap.dedent(paragraph).strip("\n") + "\n```")
            continue
        text = " ".join(paragraph.split())
        literal = text.endswith("::")
        out.append(text[:-1] if literal else text)
    return "\n\n".join(out)


def scenario_reference() -> str:
    """``docs/scenarios.md``: a section per table of the scenario file, a row per field
    (type, default, description), each table's meaning from its model's docstring."""
    lines = [
        "# The scenario file: every table and field",
        "",
        "Generated from the scenario models by `zerowindow schema --markdown` (a test fails "
        "when this file is stale): edit the models, not this file. `zerowindow schema` prints "
        "the same as a JSON Schema for editors (see the end). Units are in the field names "
        "(`_s` seconds, `_ms` milliseconds, `_bytes`, `_kbit`...); a pluggable part is a table "
        "whose `kind` chooses its fields.",
        "",
    ]
    seen: set[type[BaseModel]] = set()
    queue: list[tuple[str, type[BaseModel]]] = [("top level", Scenario)]
    while queue:
        where, model = queue.pop(0)
        if model in seen:
            continue
        seen.add(model)
        kind = model.model_fields.get("kind")
        title = f"`{where}`" if where != "top level" else "The top level"
        if kind is not None and isinstance(kind.default, str):
            title += f": `kind = {json.dumps(kind.default)}`"
        lines += [f"## {title} ({model.__name__})", "", _doc(model), ""]
        lines += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
        for name, info in model.model_fields.items():
            described = " ".join((info.description or "").split()).replace("|", "\\|")
            lines.append(
                f"| `{name}` | {_type_text(_field_annotation(info))} | {_default_text(info)} "
                f"| {described} |"
            )
            prefix = name if where == "top level" else f"{where}.{name}"
            queue += [(prefix, m) for m in _models_in(_field_annotation(info)) if m not in seen]
        lines.append("")
    lines += [
        "## Editor support",
        "",
        "`zerowindow schema > zerowindow.schema.json` writes the JSON Schema; with taplo or "
        "Even Better TOML, put `#:schema ./zerowindow.schema.json` as the first line of a "
        "scenario file.",
        "",
    ]
    return "\n".join(lines)
