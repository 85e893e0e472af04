"""Command-line options generated from a pydantic model: one ``--field-name`` per field.

Used by the standalone servers (``python -m harness._sim``, ``python -m harness._egress``) so
that every configuration field is an option with its description and default as help.
"""

from __future__ import annotations

import argparse
import typing
from collections.abc import Collection, Mapping
from typing import Any

from pydantic import BaseModel


def _or_none(kind: Any) -> Any:
    """An argparse type for an optional field: ``none`` is None, anything else ``kind``."""

    def parse(text: str) -> Any:
        return None if text.lower() == "none" else kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")
    return parse


def _bool(text: str) -> bool:
    """An argparse type for a bool field: true/false, on/off, yes/no, 1/0."""
    value = text.strip().lower()
    if value in ("true", "on", "yes", "1"):
        return True
    if value in ("false", "off", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def add_model_options(
    parser: argparse.ArgumentParser, model: type[BaseModel], *, skip: Collection[str] = ()
) -> None:
    """Add ``--name`` for every field of ``model`` but those in ``skip``.

    A ``Literal`` field becomes a choice; a ``bool`` takes true/false (on/off, yes/no, 1/0);
    ``X | None`` parses as ``X``, with ``none`` for None.
    Options left out of the command line are absent from the parsed namespace
    (``argparse.SUPPRESS``), so the model's defaults apply.
    """
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        annotation = field.annotation
        args = typing.get_args(annotation)
        kind: Any
        choices: tuple[Any, ...] | None
        if typing.get_origin(annotation) is typing.Literal:
            choices, kind = args, str
        else:
            choices, kind = None, next((a for a in args if a is not type(None)), annotation)
            if kind is bool:
                kind = _bool
            if type(None) in args:
                kind = _or_none(kind)
        parser.add_argument(
            "--" + name.replace("_", "-"),
            dest=name,
            type=kind,
            choices=choices,
            default=argparse.SUPPRESS,
            help=f"{field.description or name} (default: {field.default})",
        )


def model_argv(values: Mapping[str, object]) -> list[str]:
    """The options :func:`add_model_options` reads back as ``values`` (field name -> value):
    ``--field-name VALUE`` each, ``none`` for None, ``true``/``false`` for a bool."""
    argv: list[str] = []
    for name, value in values.items():
        text = (
            "none"
            if value is None
            else str(value).lower()
            if isinstance(value, bool)
            else str(value)
        )
        argv += ["--" + name.replace("_", "-"), text]
    return argv
