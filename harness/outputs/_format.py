"""How every output writes a number: the console tables, the job summary, the comparison
files and the HTML report."""

from __future__ import annotations

import math
from typing import Any


def fmt_number(value: Any, digits: int | None = None) -> str:
    """A table cell. ``-`` for ``None`` or NaN; an ``int`` with thousands separators; a float
    with ``digits`` decimals and thousands separators, or, when ``digits`` is ``None``, with
    1 to 3 significant decimals by magnitude (a whole float as an integer). Anything that is
    not a number is written with ``str``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if digits is not None:
        return f"{value:,.{digits}f}"
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.1f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"
