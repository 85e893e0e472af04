"""A read behaviour defined outside the toolkit, in one file with one registration: read at
most ``bytes_per_read`` bytes per ``recv``, then wait ``pause_s`` after each read returns.
``tests/test_extending.py`` names this file in a scenario's ``plugins`` and runs it through the
command line, so the Locust processes must import it too."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from loadgen import READS, ReadBehaviour


@READS.register
class SipRead(ReadBehaviour):
    """``bytes_per_read`` bytes per ``recv``, ``pause_s`` after each."""

    kind: Literal["sip"] = "sip"
    bytes_per_read: int = Field(1024, ge=1)
    pause_s: float = Field(0.01, gt=0)

    def next_read_at(self, slot_s: float, returned_s: float) -> float:
        return returned_s + self.pause_s
