"""Read pacing: how much a client asks of its socket per ``recv`` and how often.

``full_speed`` reads up to 64 KiB per ``recv`` as soon as data is there. ``paced`` reads at
most ``bytes_per_read`` per ``recv`` and at most one ``recv`` per ``interval_s``, so the kernel
receive buffer fills and the advertised window (rwnd) shrinks, down to a zero window when the
server sends faster than ``bytes_per_read / interval_s`` bytes/s. Pacing holds at the socket
because the client does its own ``recv`` calls (see ``_stream``).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from zwcore import Registry


class ReadBehaviour(BaseModel):
    """How a client reads its stream (a read behaviour kind subclasses this and registers with
    :data:`READS`): at most ``bytes_per_read`` bytes per ``recv`` (a class constant or a field,
    as the kind needs), the next ``recv`` at :meth:`next_read_at`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str
    reads_on_arrival: ClassVar[bool] = False
    """True for a kind that calls ``recv`` again as soon as the last one returned, so that a
    read is late only by the client's own scheduling: its reads are then stamped with the
    kernel's arrival time (``_stamps``) unless the group asks for ``timestamps = "read"``."""

    def next_read_at(self, slot_s: float, returned_s: float) -> float:
        """Monotonic time (s) of the next ``recv``, given this read's slot and return time."""
        raise NotImplementedError


READS: Registry[ReadBehaviour] = Registry("read behaviour")

FULL_SPEED_READ_BYTES = 65536


@READS.register
class FullSpeed(ReadBehaviour):
    """Read as fast as possible: ``recv(65536)`` in a loop."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["full_speed"] = "full_speed"
    bytes_per_read: ClassVar[int] = FULL_SPEED_READ_BYTES
    reads_on_arrival: ClassVar[bool] = True

    def next_read_at(self, slot_s: float, returned_s: float) -> float:
        """Monotonic time (s) of the next ``recv``: immediately."""
        return returned_s


@READS.register
class Paced(ReadBehaviour):
    """Read ``bytes_per_read`` bytes (at most) every ``interval_s`` seconds.

    Reads start on a fixed grid ``interval_s`` apart; after a ``recv`` that blocked past its
    slot (no data yet), the grid restarts one interval after it returned, so no two reads are
    closer than ``interval_s`` in steady state. Validation errors: ``bytes_per_read < 1``,
    ``interval_s <= 0``.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: Literal["paced"] = "paced"
    bytes_per_read: int = Field(default=64, ge=1)
    interval_s: float = Field(default=0.1, gt=0)

    def next_read_at(self, slot_s: float, returned_s: float) -> float:
        """Monotonic time (s) of the next ``recv``, given this read's slot and return time."""
        nxt = slot_s + self.interval_s
        return nxt if nxt >= returned_s else returned_s + self.interval_s


ReadConfig = Annotated[ReadBehaviour, READS.validator, READS.serializer]
"""A field holding any registered read behaviour, chosen by its ``kind``."""
