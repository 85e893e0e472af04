"""CPU lists in the kernel's list format (cpuset(7), "List format"; taskset(1) ``-c``)."""

from __future__ import annotations

from collections.abc import Iterable

# The kernel's largest CONFIG_NR_CPUS is 8192: CPU numbers run from 0 to 8191.
MAX_CPU = 8191


def parse_cpu_list(text: str) -> tuple[int, ...]:
    """The CPUs of a list such as ``"0,2,4-7"`` (cpuset(7), "List format"), sorted and without
    repeats. Raises ``ValueError`` naming the bad item for anything else (an empty list, a
    negative number, a range whose end is below its start)."""
    cpus: set[int] = set()
    for item in text.split(","):
        first, sep, last = item.strip().partition("-")
        try:
            lo = int(first)
            hi = int(last) if sep else lo
        except ValueError:
            raise ValueError(f"{item.strip()!r} is not a CPU number or range (e.g. 0-3)") from None
        if lo < 0 or hi < lo:
            raise ValueError(f"{item.strip()!r} is not a CPU range (e.g. 0-3)")
        if hi > MAX_CPU:
            raise ValueError(f"{item.strip()!r}: CPU numbers go up to {MAX_CPU}")
        cpus.update(range(lo, hi + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: Iterable[int]) -> str:
    """The shortest list-format text of ``cpus``: ``(0, 1, 2, 5)`` → ``"0-2,5"``."""
    out: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
