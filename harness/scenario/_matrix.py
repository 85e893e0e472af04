"""The disconnect matrix: a scenario's ``[matrix]`` table, expanded into user groups.

Each cell is one phase at which clients leave (``queued``, ``prefill``, ``decode``) crossed
with one way of leaving (:data:`loadgen.LEAVE_STYLES`) and, with ``answers``, with how the
answer is asked for: streamed (``stream``, cells ``<phase>-<leave>``) or whole (``whole``:
``stream = false``, cells ``<phase>-<leave>-whole``; vLLM #10806: a client that abandons a
non-streaming request). Cells run one after another, each in its own window of ``cell_s``
seconds, after a control window in which only the victims run:

- ``victims``: an open-loop group (constant ``victim_rps``, short requests, full-speed reads)
  for the whole timeline, whose TTFT and ITL in each window say what the cell cost the others,
  and ``tail_s`` more (the last cell's zombies decode to the end before the run ends: at its
  end the run releases the vanished connections, and the server hears them close);
- per cell ``<phase>-<leave>[-whole]`` (in the order of :meth:`MatrixConfig.cells`: the
  ``vanish`` cells last): ``repeats`` clients sent at the window's start that leave together:
  ``queued`` ``leave_after_s`` after the send while ``queue_fill`` long requests (group
  ``<phase>-<leave>-fill``, sent just before; they reset at the window's end) hold every batch
  slot (``queue_fill`` must be at least the engine's ``max_num_seqs``);
  ``prefill`` ``prefill_leave_after_s`` after sending a ``prefill_prompt_tokens`` prompt
  (asking ``prefill_max_tokens``);
  ``decode`` ``decode_leave_after_s`` after its first token (counted from the token's
  arrival, reading nothing meanwhile: it leaves only once the engine is decoding its
  request, however long a busy engine kept it queued, and a load process late to read still
  leaves mid-decode; ``None``: after ``decode_after_tokens`` tokens). ``stall_*`` ways stall
  ``stall_s`` first.

The phase a client really left in is read from the engine's own records afterwards
(``harness.analysis._leaves``): a cell says what was intended, the analysis what happened,
and a cell none of whose clients left in its phase is reported as not exercised
(``harness.analysis._matrix``; its gates are inconclusive).
:func:`expand_matrix` adds the groups before the scenario is validated, so gates may name
cells (``decode-fin.leave_to_abort_max_ms <= 2000``); the matrix owns every group named
``victims`` or ``<phase>-<leave>[-whole][-fill]`` and replaces a group of that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from loadgen import LEAVE_STYLES, LeaveStyle

Phase = Literal["queued", "prefill", "decode"]
MATRIX_PHASES: tuple[Phase, ...] = ("queued", "prefill", "decode")
Answer = Literal["stream", "whole"]
VICTIMS = "victims"
FILL_LEAD_S = 0.3  # fillers go this long before a queued cell's leavers


class MatrixConfig(BaseModel):
    """The disconnect matrix (see the module docstring). Times in seconds from the start of
    the load phase; lengths in tokens."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    phases: list[Phase] = Field(default_factory=lambda: list(MATRIX_PHASES), min_length=1)
    leaves: list[LeaveStyle] = Field(default_factory=lambda: list(LEAVE_STYLES), min_length=1)
    answers: list[Answer] = Field(
        default_factory=lambda: list[Answer](["stream"]),
        min_length=1,
        description="stream: streamed answers; whole: answers asked whole (stream = false, "
        "cells <phase>-<leave>-whole)",
    )
    repeats: int = Field(3, ge=1, description="clients per cell, leaving together")
    cell_s: float = Field(6.0, gt=1, description="each cell's window (the control's too)")
    max_tokens: int = Field(512, ge=1, description="output asked by leavers and fillers")
    prompt_tokens: int = Field(32, ge=1)
    leave_after_s: float = Field(0.5, gt=0, description="queued: leave this long after send")
    prefill_prompt_tokens: int = Field(300, ge=1)
    prefill_max_tokens: int = Field(
        128, ge=1, description="prefill: output asked (prompt and output fit the context)"
    )
    prefill_leave_after_s: float = Field(0.02, gt=0)
    decode_leave_after_s: float | None = Field(
        0.3,
        ge=0,
        description="decode: leave this long after the first token arrived, reading nothing "
        "meanwhile (never while still queued on a busy engine; a load process late to read "
        "still leaves while the engine decodes; 0: at the first token's read); None: after "
        "decode_after_tokens tokens",
    )
    decode_after_tokens: int = Field(8, ge=1)
    whole_decode_leave_after_s: float = Field(
        0.5, gt=0, description="decode, whole answers: leave this long after the send"
    )
    stall_s: float = Field(2.0, gt=0, description="stall_fin, stall_rst: stall this long")
    queue_fill: int = Field(16, ge=1, description="queued cells: requests that fill the batch")
    tail_s: float = Field(
        8.0,
        ge=0,
        description="victims go on this long after the last cell, so that its zombies decode "
        "to the end before the run ends (and releases the vanished connections)",
    )
    victim_rps: float = Field(4.0, gt=0)
    victim_max_tokens: int = Field(32, ge=1)
    victim_prompt_tokens: int = Field(32, ge=1)

    def cells(self) -> list[Cell]:
        """Every cell, in run order: answer by answer, phase by phase, the ``vanish`` cells
        last (nothing ever aborts a vanished client's request: it decodes to ``max_tokens``,
        holding batch slots and KV through the windows after it, where it would queue the
        next cells' clients)."""
        cells = [Cell(p, h, a) for a in self.answers for p in self.phases for h in self.leaves]
        return [c for c in cells if c.leave != "vanish"] + [c for c in cells if c.leave == "vanish"]

    def window(self, index: int) -> tuple[float, float]:
        """Start and end (s from the load phase's start) of cell ``index``; ``-1``: the
        control window."""
        start = (index + 1) * self.cell_s
        return start, start + self.cell_s

    @property
    def timeline_s(self) -> float:
        """Control window, every cell and the tail (s): how long the victims send."""
        return (len(self.cells()) + 1) * self.cell_s + self.tail_s


@dataclass(frozen=True)
class Cell:
    """One cell of the matrix: the phase its clients leave in, how they leave, and whether
    their answers are streamed (``stream``) or asked whole (``whole``)."""

    phase: str
    leave: str
    answer: str = "stream"

    @property
    def name(self) -> str:
        """The cell's group name: ``<phase>-<leave>``, ``-whole`` added for whole answers."""
        return f"{self.phase}-{self.leave}" + ("-whole" if self.answer == "whole" else "")


def _leave(matrix: MatrixConfig, cell: Cell) -> dict[str, Any]:
    phase, how = cell.phase, cell.leave
    stall = {"stall_s": matrix.stall_s} if how.startswith("stall_") else {}
    if phase == "decode" and cell.answer == "whole":  # no token to wait for
        return {"kind": "leave", "how": how, "after_s": matrix.whole_decode_leave_after_s, **stall}
    if phase == "decode" and matrix.decode_leave_after_s is None:
        return {"kind": "leave", "how": how, "after_tokens": matrix.decode_after_tokens, **stall}
    if phase == "decode":  # once the engine decodes it: its first token, then the delay
        wait = {"after_tokens": 1, "wait_s": matrix.decode_leave_after_s}
        return {"kind": "leave", "how": how, **wait, **stall}
    after = {"queued": matrix.leave_after_s, "prefill": matrix.prefill_leave_after_s}[phase]
    return {"kind": "leave", "how": how, "after_s": after, **stall}


def matrix_groups(matrix: MatrixConfig) -> list[dict[str, Any]]:
    """The user groups (as scenario data) of ``matrix``: victims, then each cell's leavers
    (and fillers)."""
    groups: list[dict[str, Any]] = [
        {
            "name": VICTIMS,
            "arrival": {
                "kind": "constant",
                "rate_rps": matrix.victim_rps,
                "duration_s": matrix.timeline_s,
            },
            "prompt_tokens": matrix.victim_prompt_tokens,
            "max_tokens": matrix.victim_max_tokens,
        }
    ]
    for i, cell in enumerate(matrix.cells()):
        start, end = matrix.window(i)
        name, phase = cell.name, cell.phase
        leaver: dict[str, Any] = {
            "name": name,
            "users": matrix.repeats,
            "requests_per_user": 1,
            "start_after_s": start,
            "prompt_tokens": matrix.prompt_tokens,
            "max_tokens": matrix.max_tokens,
            "action": _leave(matrix, cell),
        }
        if cell.answer == "whole":
            leaver["stream"] = False
        if phase == "prefill":
            leaver["prompt_tokens"] = matrix.prefill_prompt_tokens
            leaver["max_tokens"] = matrix.prefill_max_tokens
        if phase == "queued":
            groups.append({
                "name": f"{name}-fill",
                "users": matrix.queue_fill,
                "requests_per_user": 1,
                "start_after_s": start,
                "prompt_tokens": matrix.prompt_tokens,
                "max_tokens": matrix.max_tokens,
                "action": {"kind": "leave", "how": "rst", "after_s": end - start - 0.5},
            })  # fmt: skip
            leaver["start_after_s"] = start + FILL_LEAD_S
        groups.append(leaver)
    return groups


def expand_matrix(data: Any) -> Any:
    """Scenario data with the ``matrix`` table's groups added (replacing groups of the same
    names); unchanged when there is no matrix or it does not validate (the scenario's own
    validation then reports its errors where they are)."""
    if not isinstance(data, dict) or not isinstance(data.get("matrix"), dict):
        return data
    try:
        matrix = MatrixConfig.model_validate(data["matrix"])
    except ValidationError:
        return data
    generated = matrix_groups(matrix)
    names = {g["name"] for g in generated}
    own = [
        g for g in data.get("groups", []) if not (isinstance(g, dict) and g.get("name") in names)
    ]
    return {**data, "groups": [*own, *generated]}
