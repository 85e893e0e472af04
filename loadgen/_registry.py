"""A small lookup of pydantic models by their ``kind`` tag.

Every pluggable part of the load generator (read pacing, client actions) is a frozen pydantic
model with a ``kind: Literal[...]`` field, registered here; an unknown kind raises an error
that lists the valid ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

M = TypeVar("M", bound=BaseModel)


class UnknownKindError(ValueError):
    """Raised for a ``kind`` that no model of a registry is registered under."""


class Registry(Generic[M]):
    """Models of one family (``what``, e.g. ``"read behaviour"``) keyed by their ``kind``."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._by_kind: dict[str, type[M]] = {}

    def register(self, cls: type[M]) -> type[M]:
        """Class decorator: register ``cls`` under the default of its ``kind`` field.

        Raises ``TypeError`` if ``cls`` has no string default for ``kind``, ``ValueError`` if
        the kind is taken.
        """
        field = cls.model_fields.get("kind")
        kind = field.default if field is not None else None
        if not isinstance(kind, str):
            raise TypeError(f"{cls.__name__} needs a `kind` field with a string default")
        if kind in self._by_kind:
            raise ValueError(f"{self.what} kind {kind!r} is already registered")
        self._by_kind[kind] = cls
        return cls

    def kinds(self) -> list[str]:
        """The registered kinds, sorted."""
        return sorted(self._by_kind)

    def get(self, kind: str) -> type[M]:
        """The model registered under ``kind``; raises :class:`UnknownKindError` otherwise."""
        try:
            return self._by_kind[kind]
        except KeyError:
            raise UnknownKindError(
                f"unknown {self.what} kind {kind!r}; valid kinds: {', '.join(self.kinds())}"
            ) from None

    def parse(self, data: Mapping[str, Any] | M) -> M:
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
        return self.get(str(data["kind"])).model_validate(dict(data))
