"""Reading and writing the run folder's JSON and Parquet files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from zwcore import RunFolderError


def to_builtin(value: Any) -> Any:
    """numpy scalars to Python numbers, recursively, for JSON."""
    if isinstance(value, dict):
        return {k: to_builtin(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_builtin(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    return value


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as indented JSON (numpy scalars as numbers, anything else by ``str``)."""
    path.write_text(json.dumps(to_builtin(data), indent=2, default=str) + "\n")


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``. Raises :class:`~zwcore.RunFolderError` naming the file if
    it is missing, unreadable or not a JSON object."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing (is {path.parent} a run folder?)") from None
    except (OSError, ValueError) as exc:
        raise RunFolderError(f"{path}: cannot read: {exc}") from None
    if not isinstance(data, dict):
        raise RunFolderError(f"{path}: expected a JSON object")
    return data


def write_parquet(frame: pd.DataFrame, path: Path) -> None:
    """Write ``frame`` as Parquet (pyarrow engine, no index)."""
    frame.to_parquet(path, engine="pyarrow", index=False)


def read_parquet(path: Path) -> pd.DataFrame:
    """The table in ``path``; an empty frame if the file does not exist. Raises
    :class:`~zwcore.RunFolderError` for a file that is not readable Parquet."""
    if not path.exists():
        return pd.DataFrame()
    try:
        return pd.read_parquet(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise RunFolderError(f"{path}: cannot read Parquet: {exc}") from None
