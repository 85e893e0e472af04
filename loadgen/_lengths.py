"""Length distributions for prompt and output tokens, drawn per request from the seed.

A group's ``prompt_tokens`` and ``max_tokens`` are either a number (every request the same) or
a table with a ``kind``; the field names are close to guidellm's synthetic data
(``prompt_tokens``, ``prompt_tokens_stdev``, ``..._min``, ``..._max``) and aiperf's
(``--synthetic-input-tokens-mean``, ``-stddev``):

- ``fixed``: ``value``;
- ``uniform``: an integer from ``min`` to ``max``, both included;
- ``normal``: ``mean`` and ``stdev``, rounded, clamped to ``[min, max]``;
- ``lognormal``: a log-normal distribution whose own ``mean`` and ``stdev`` (not those of its
  logarithm) are given, rounded, clamped to ``[min, max]`` (``mu = ln(mean) - sigma^2 / 2``,
  ``sigma^2 = ln(1 + stdev^2 / mean^2)``).

Each request draws from ``random.Random`` seeded by its own prompt seed, so a run sends the
same lengths again with the same seed. Output lengths are what the request asks for
(``max_tokens``); the group's ``ignore_eos`` (vLLM's extension, on by default) makes the
engine generate exactly that many.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

from zwcore import Registry


class LengthBase(BaseModel):
    """A distribution of token counts (a kind subclasses this and registers with
    :data:`LENGTHS`); :meth:`draw` gives one count of at least 1."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str

    def draw(self, rng: random.Random) -> int:
        """One token count (at least 1)."""
        raise NotImplementedError


LENGTHS: Registry[LengthBase] = Registry("length distribution")


class _Clamped(LengthBase):
    min: int = Field(1, ge=1, description="smallest count drawn (tokens)")
    max: int | None = Field(None, ge=1, description="largest count drawn (tokens)")

    @model_validator(mode="after")
    def _ordered(self) -> _Clamped:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"max={self.max} is below min={self.min}")
        return self

    def _clamp(self, x: float) -> int:
        n = max(self.min, round(x))
        return n if self.max is None else min(self.max, n)


@LENGTHS.register
class FixedLength(LengthBase):
    """Every request ``value`` tokens."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(ge=1, description="tokens")

    def draw(self, rng: random.Random) -> int:
        return self.value


@LENGTHS.register
class UniformLength(LengthBase):
    """An integer from ``min`` to ``max`` tokens, both included, each as likely."""

    kind: Literal["uniform"] = "uniform"
    min: int = Field(ge=1, description="tokens")
    max: int = Field(ge=1, description="tokens")

    @model_validator(mode="after")
    def _ordered(self) -> UniformLength:
        if self.max < self.min:
            raise ValueError(f"max={self.max} is below min={self.min}")
        return self

    def draw(self, rng: random.Random) -> int:
        return rng.randint(self.min, self.max)


@LENGTHS.register
class NormalLength(_Clamped):
    """Normal with ``mean`` and ``stdev`` (tokens), rounded and clamped to ``[min, max]``."""

    kind: Literal["normal"] = "normal"
    mean: float = Field(gt=0, description="tokens")
    stdev: float = Field(ge=0, description="tokens")

    def draw(self, rng: random.Random) -> int:
        return self._clamp(rng.gauss(self.mean, self.stdev))


@LENGTHS.register
class LognormalLength(_Clamped):
    """Log-normal whose own ``mean`` and ``stdev`` (tokens) are given, rounded and clamped
    to ``[min, max]``: a long tail of long requests, as in production traces."""

    kind: Literal["lognormal"] = "lognormal"
    mean: float = Field(gt=0, description="tokens")
    stdev: float = Field(gt=0, description="tokens")

    def draw(self, rng: random.Random) -> int:
        sigma2 = math.log1p((self.stdev / self.mean) ** 2)
        mu = math.log(self.mean) - sigma2 / 2
        return self._clamp(rng.lognormvariate(mu, math.sqrt(sigma2)))


LengthConfig = Annotated[LengthBase, LENGTHS.validator, LENGTHS.serializer]
"""A field holding any registered length distribution, chosen by its ``kind``."""


class _TokenCountField:
    """Pydantic metadata of :data:`TokenCount`: a whole number of at least 1 stays a number; a
    table is validated by its ``kind`` (errors at their own location, as any registry
    field's); the JSON Schema is one of the two."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return core_schema.no_info_plain_validator_function(
            _validate_count,
            serialization=core_schema.plain_serializer_function_ser_schema(_dump_count),
        )

    def __get_pydantic_json_schema__(
        self, schema: Any, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {
            "oneOf": [{"type": "integer", "minimum": 1}, *LENGTHS.json_schema_variants(handler)],
            "description": "tokens: a number, or a length distribution chosen by its `kind`: "
            + ", ".join(LENGTHS.kinds()),
        }


def _validate_count(value: Any) -> int | LengthBase:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise PydanticCustomError(
                "greater_than_equal", "Input should be at least 1 (tokens), or a table with a "
                "`kind`: {kinds}", {"kinds": ", ".join(LENGTHS.kinds())},
            )  # fmt: skip
        return value
    if isinstance(value, BaseModel | Mapping):
        return LENGTHS.validate_value(value)
    raise PydanticCustomError(
        "token_count", "expected a whole number of tokens, or a table with a `kind`: {kinds}",
        {"kinds": ", ".join(LENGTHS.kinds())},
    )  # fmt: skip


def _dump_count(value: int | LengthBase) -> Any:
    return value if isinstance(value, int) else value.model_dump(mode="json")


TokenCount = Annotated[int | LengthBase, _TokenCountField()]
"""A group's ``prompt_tokens`` or ``max_tokens``: a number, or a distribution."""


def draw_tokens(value: int | LengthBase, rng: random.Random) -> int:
    """``value`` itself, or one draw of the distribution."""
    return value if isinstance(value, int) else value.draw(rng)
