"""Registries: the pluggable parts of the toolkit looked up by their ``kind``.

Every pluggable part (read behaviours, client actions, targets, proxies, shaping backends) is a
frozen pydantic model with a ``kind`` field whose default names it, registered in a
:class:`Registry`. Scenario fields that hold such a part are declared as
``Annotated[Base, REG.validator, REG.serializer]``: they validate against whatever is
registered when validation runs, so a
new kind is one class and one registration, and no union is ever kept by hand. An unknown kind
raises an error that lists the valid ones.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import (
    BaseModel,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    PlainSerializer,
    ValidationError,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticCustomError

from zwcore._errors import ZerowindowError

M = TypeVar("M")


class UnknownKindError(ZerowindowError, ValueError):
    """Raised for a missing ``kind``, or one no model of a registry is registered under; the
    message lists the valid kinds."""


class Registry(Generic[M]):
    """Classes of one family (``what``, e.g. ``"read behaviour"``) keyed by their ``kind``:
    pydantic models (the ``kind`` field's default) or plain classes (a ``kind`` class
    attribute, e.g. a shaping backend)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_kind: dict[str, type[M]] = {}
        self.validator = _KindField(self)
        """Pydantic metadata for a field of this family: ``Annotated[Base, REG.validator,
        REG.serializer]`` validates a mapping by its ``kind`` against the models registered
        at validation time (a kind registered after the field's model was defined is
        accepted), and reports a bad field at its own location inside the field
        (``target.port``, as a discriminated union would; see :func:`relocated_errors`). Its
        JSON Schema is one of the models registered when the schema is made, told apart by
        ``kind``."""
        self.serializer = PlainSerializer(_dump, return_type=dict)
        """Pydantic metadata that serializes the field as the model's own fields."""

    def register(self, cls: type[M]) -> type[M]:
        """Class decorator: register ``cls`` under its kind (the default of a pydantic model's
        ``kind`` field, else the class attribute ``kind``).

        Raises ``TypeError`` if ``cls`` has no string kind, ``ValueError`` if the kind is taken
        by another class.
        """
        kind = kind_of(cls)
        if not isinstance(kind, str):
            raise TypeError(f"{cls.__name__} needs a `kind` field with a string default")
        known = self._by_kind.get(kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"{self.what} kind {kind!r} is already registered")
        self._by_kind[kind] = cls  # the same class again (a module reloaded) replaces itself
        return cls

    def kinds(self) -> list[str]:
        """The registered kinds, sorted."""
        return sorted(self._by_kind)

    def models(self) -> list[type[M]]:
        """The registered models, by kind."""
        return [self._by_kind[k] for k in self.kinds()]

    def json_schema_variants(self, handler: GetJsonSchemaHandler) -> list[dict[str, Any]]:
        """The JSON Schema of each registered model, as its own copy, with ``kind`` required
        (a table without it is none of them: the validator asks for it too)."""
        variants = []
        for model in self.models():
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                continue
            schema = handler(model.__pydantic_core_schema__)
            variant = copy.deepcopy(handler.resolve_ref_schema(schema))
            variant["required"] = ["kind", *(r for r in variant.get("required", []) if r != "kind")]
            variants.append(variant)
        return variants

    def get(self, kind: str) -> type[M]:
        """The model registered under ``kind``; raises :class:`UnknownKindError` otherwise."""
        try:
            return self._by_kind[kind]
        except KeyError:
            raise UnknownKindError(
                f"unknown {self.what} kind {kind!r}; valid kinds: {', '.join(self.kinds())}"
            ) from None

    def parse(self, data: Mapping[str, Any] | BaseModel) -> M:
        """Validate ``data`` (a mapping with a ``kind`` key, or a model instance).

        Raises :class:`UnknownKindError` for a missing or unknown kind and
        ``pydantic.ValidationError`` for bad fields.
        """
        if isinstance(data, BaseModel):
            kind = getattr(data, "kind", None)
            if self.get(str(kind)) is not type(data):
                raise UnknownKindError(f"{type(data).__name__} is not a registered {self.what}")
            return data
        if "kind" not in data:
            raise UnknownKindError(
                f"{self.what} needs a `kind`; valid kinds: {', '.join(self.kinds())}"
            )
        model: Any = self.get(str(data["kind"]))
        validated: M = model.model_validate(dict(data))
        return validated

    def _validate(self, value: Any, handler: Any) -> M:
        return self.validate_value(value)

    def validate_value(self, value: Any) -> M:
        """Validate a field's value (a mapping with a ``kind``, or a model instance) for a
        pydantic validator of a field that holds this family (``Registry.validator`` is one;
        a field that also takes another form calls this for the table form): raises pydantic's
        errors, those of a bad field at its own location (see :func:`relocated_errors`)."""
        if not isinstance(value, BaseModel | Mapping):
            raise PydanticCustomError(
                "model_type", "expected a table with a `kind`; valid kinds: {kinds}",
                {"kinds": ", ".join(self.kinds())},
            )  # fmt: skip
        try:
            return self.parse(value)
        except UnknownKindError as exc:
            raise PydanticCustomError("union_tag_invalid", str(exc)) from None
        except ValidationError as exc:
            raise _Relocated(exc) from None


_EXPANDING: set[Registry[Any]] = set()
"""Registries whose JSON Schema is being written (a kind that holds kinds of its own registry
gets a plain object schema inside, not an endless one)."""

class _KindField:
    """The metadata behind ``Registry.validator``: validation by ``kind`` (a pydantic
    ``WrapValidator``) and a JSON Schema that is ``oneOf`` the registered models."""

    def __init__(self, registry: Registry[Any]) -> None:
        self._registry = registry
        self._wrap = WrapValidator(registry._validate)

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return self._wrap.__get_pydantic_core_schema__(source, handler)

    def __get_pydantic_json_schema__(
        self, core_schema: Any, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        registry = self._registry
        description = f"a {registry.what}, chosen by its `kind`: " + ", ".join(registry.kinds())
        if registry in _EXPANDING:  # a kind holds others of its registry (a proxy chain's hops)
            return {"type": "object", "required": ["kind"], "description": description}
        _EXPANDING.add(registry)
        try:
            return {"oneOf": registry.json_schema_variants(handler), "description": description}
        finally:
            _EXPANDING.discard(registry)


def kind_of(cls: type) -> Any:
    """The kind ``cls`` is registered under: a pydantic model's ``kind`` default, else its
    ``kind`` class attribute (``None`` if it has neither)."""
    fields = getattr(cls, "model_fields", None)
    if isinstance(fields, dict):
        field = fields.get("kind")
        return field.default if field is not None else None
    return getattr(cls, "kind", None)


class _Relocated(ValueError):
    """Carries a nested model's validation errors up to :func:`relocate_errors`."""

    def __init__(self, error: ValidationError) -> None:
        super().__init__(str(error))
        self.error = error


def _dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


def relocated_errors(error: ValidationError) -> list[ErrorDetails]:
    """The line errors of ``error`` with those of registry fields (``Registry.validator``)
    replaced by the nested model's own errors, each at its full location."""
    out: list[ErrorDetails] = []
    for err in error.errors():
        ctx = err.get("ctx") or {}
        inner = ctx.get("error")
        if isinstance(inner, _Relocated):
            for sub in relocated_errors(inner.error):
                out.append({**sub, "loc": (*err["loc"], *sub["loc"])})
            continue
        out.append(err)
    return out
