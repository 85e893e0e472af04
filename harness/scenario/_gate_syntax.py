"""Gate syntax: a scenario's pass/fail conditions on summary figures, as written and parsed.

Evaluation against a run's figures is :mod:`harness.gates`.

A gate is one line of text, ``FIGURE OP BOUND``, for example::

    fast.ttft_p99_ms <= 800
    fast.itl_p99_ms <= 1.2 * baseline
    server.preemptions <= baseline + 5
    kv_held_after_finish_s <= 1
    client_saturated == 0

Grammar (whitespace is free between tokens)::

    gate    := FIGURE OP bound
    OP      := "<=" | "<" | ">=" | ">" | "=="
    bound   := ["+" | "-"] NUMBER                      absolute bound
             | scaled [("+" | "-") NUMBER]              relative to the baseline's value
    scaled  := NUMBER "*" "baseline" | "baseline" ["*" NUMBER]

``FIGURE`` is a name from :mod:`harness.runfolder` (checked against the scenario's groups when
the scenario is loaded); ``NUMBER`` is a decimal such as ``800``, ``1.2`` or ``2e3``. A
relative bound is ``factor * baseline + offset``, where ``baseline`` is the same figure in the
baseline file (see :mod:`harness.gates._baseline`).

A **distribution gate** compares a sample (``<group>.<kind>``, e.g. ``fast.ttft_ms``: every
request's value, :data:`harness.runfolder.SAMPLE_KINDS`) with the baseline's::

    fast.ttft_ms ~ baseline                  # medians within 10 % (the default threshold)
    fast.itl_ms ~ baseline within 5%

    dgate   := SAMPLE "~" "baseline" ["within" NUMBER "%"]

A **history gate** compares a figure with its own past, the runs of the same scenario and
provenance in the history store (:mod:`harness.history`)::

    fast.ttft_p99_ms ~ history               # fails after a change point worse by over 10 %
    fast.output_tokens_per_s ~ history within 5%

    hgate   := FIGURE "~" "history" ["within" NUMBER "%"]

It fails when the newest runs lie after change points (Apache Otava's E-divisive with a
t-test) that together worsen the figure by more than ``within``; which way is worse follows
from the figure's name (:func:`harness.history.worse_direction`).

Evaluation (:func:`evaluate_gates`) is strict: a figure this run did not measure (``None``)
fails, and so does a relative gate whose baseline lacks the figure, each with its reason.
A relative gate may also come out inconclusive when the intervals of the run and the baseline
straddle the bound (:mod:`harness.gates._evaluate`).
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le,
    "<": operator.lt,
    ">=": operator.ge,
    ">": operator.gt,
    "==": operator.eq,
}
SAME = "~"  # the distribution gate's operator
DEFAULT_WITHIN = 0.10  # a distribution gate's threshold on the ratio of medians

_FIGURE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_OP = re.compile(r"<=|>=|==|<|>|~")
_TOKEN = re.compile(
    r"(?P<number>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<word>[A-Za-z_][A-Za-z0-9_.]*)"
    r"|(?P<star>\*)|(?P<plus>\+)|(?P<minus>-)|(?P<percent>%)"
)


class GateSyntaxError(ValueError):
    """A gate that does not follow the grammar. ``column`` is 1-based within ``gate``;
    ``str(error)`` names the gate, the column and what was expected there."""

    def __init__(self, gate: str, column: int, expected: str) -> None:
        self.gate, self.column, self.expected = gate, column, expected
        super().__init__(f"gate {gate!r}: {expected} at column {column}")


@dataclass(frozen=True)
class Gate:
    """A parsed gate. For an absolute gate the bound is ``offset`` (``relative`` is False);
    for a relative one it is ``factor * baseline + offset``. A distribution gate (``op`` is
    ``~``) is relative and passes when the ratio of medians stays within ``1 ± within``."""

    text: str
    figure: str
    op: str
    relative: bool
    factor: float = 1.0
    offset: float = 0.0
    within: float = DEFAULT_WITHIN
    against: str = "baseline"  # a ``~`` gate's reference: ``baseline`` or ``history``

    @property
    def distribution(self) -> bool:
        """Whether this is a distribution gate (``SAMPLE ~ baseline``)."""
        return self.op == SAME and self.against == "baseline"

    @property
    def history(self) -> bool:
        """Whether this is a history gate (``FIGURE ~ history``)."""
        return self.op == SAME and self.against == "history"

    def bound(self, baseline: float | None = None) -> float | None:
        """The bound for this gate; ``None`` for a relative gate without a baseline value."""
        if not self.relative:
            return self.offset
        return None if baseline is None else self.factor * baseline + self.offset

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class _Tok:
    kind: str
    text: str
    column: int  # 1-based


def _tokens(text: str, start: int) -> list[_Tok]:
    out: list[_Tok] = []
    pos = start
    while pos < len(text):
        if text[pos].isspace():
            pos += 1
            continue
        m = _TOKEN.match(text, pos)
        if m is None or m.lastgroup is None:
            raise GateSyntaxError(text, pos + 1, "expected a number, 'baseline', '*', '+' or '-'")
        kind = "baseline" if m.group() == "baseline" else m.lastgroup
        out.append(_Tok(kind, m.group(), pos + 1))
        pos = m.end()
    return out


def parse_gate(text: str) -> Gate:
    """Parse one gate (see the module docstring for the grammar).

    Raises :class:`GateSyntaxError` naming the column where the text departs from the grammar.
    The figure name is not checked here (see :func:`unknown_figures`).
    """
    if not isinstance(text, str):
        raise GateSyntaxError(str(text), 1, "expected a string such as 'fast.ttft_p99_ms <= 800'")
    pos = len(text) - len(text.lstrip())
    m = _FIGURE.match(text, pos)
    if m is None:
        raise GateSyntaxError(text, pos + 1, "expected a figure name such as fast.ttft_p99_ms")
    figure, pos = m.group(), m.end()
    while pos < len(text) and text[pos].isspace():
        pos += 1
    op = _OP.match(text, pos)
    if op is None:
        raise GateSyntaxError(text, pos + 1, "expected a comparison: <=, <, >=, > or ==")
    toks = _tokens(text, op.end())
    if op.group() == SAME:
        return _distribution_gate(text, figure, toks)
    if percent := next((t for t in toks if t.kind == "percent"), None):
        raise GateSyntaxError(
            text, percent.column, "expected a number, 'baseline', '*', '+' or '-'"
        )
    end_col = len(text.rstrip()) + 1
    i = 0

    def peek(*kinds: str) -> _Tok | None:
        return toks[i] if i < len(toks) and toks[i].kind in kinds else None

    def take(kind: str, expected: str) -> _Tok:
        nonlocal i
        tok = peek(kind)
        if tok is None:
            if i < len(toks):
                raise GateSyntaxError(text, toks[i].column, f"{expected}, got {toks[i].text!r}")
            raise GateSyntaxError(text, end_col, f"{expected}, got the end of the gate")
        i += 1
        return tok

    relative, factor, offset = False, 1.0, 0.0
    if sign := peek("plus", "minus"):
        i += 1
        number = float(take("number", "expected a number").text)
        offset = -number if sign.kind == "minus" else number
    elif peek("number"):
        number = float(take("number", "expected a number").text)
        if peek("star"):
            i += 1
            take("baseline", "expected 'baseline' after '*'")
            relative, factor = True, number
        else:
            offset = number
    elif peek("baseline"):
        i += 1
        relative = True
        if peek("star"):
            i += 1
            factor = float(take("number", "expected a number after '*'").text)
    else:
        take("number", "expected a number or 'baseline'")
    if relative and (sign := peek("plus", "minus")):
        i += 1
        number = float(take("number", f"expected a number after '{sign.text}'").text)
        offset = -number if sign.kind == "minus" else number
    if i < len(toks):
        what = "the end of the gate"
        if relative and not offset:
            what = "'+', '-' or " + what
        raise GateSyntaxError(text, toks[i].column, f"unexpected {toks[i].text!r}; expected {what}")
    if not all(math.isfinite(v) for v in (factor, offset)):
        raise GateSyntaxError(text, op.end() + 1, "the bound must be a finite number")
    return Gate(text.strip(), figure, op.group(), relative, factor, offset)


def _distribution_gate(text: str, figure: str, toks: list[_Tok]) -> Gate:
    """``SAMPLE ~ baseline [within NUMBER %]`` or ``FIGURE ~ history [within NUMBER %]``
    (``toks``: what follows the ``~``)."""
    kinds = [t.kind for t in toks]
    end_col = len(text.rstrip()) + 1
    against = toks[0].text if toks and toks[0].text in ("baseline", "history") else None
    if against is None:
        col = toks[0].column if toks else end_col
        raise GateSyntaxError(text, col, "expected 'baseline' or 'history' after '~'")
    within = DEFAULT_WITHIN
    if len(toks) > 1:
        if toks[1].text != "within" or kinds[2:4] != ["number", "percent"] or len(toks) > 4:
            col = toks[1].column
            raise GateSyntaxError(
                text, col, f"expected 'within N%' or the end of the gate after {against!r}"
            )
        within = float(toks[2].text) / 100.0
        if not 0 < within < 10:
            raise GateSyntaxError(text, toks[2].column, "the threshold must be within 0..1000 %")
    return Gate(text.strip(), figure, SAME, against == "baseline", within=within, against=against)


def unknown_figures(
    gates: Iterable[Gate], valid: Iterable[str], samples: Iterable[str] = ()
) -> list[Gate]:
    """The gates whose figure is not in ``valid`` (see :func:`harness.runfolder.figure_names`;
    a history gate's too), or, for a distribution gate, whose sample is not in ``samples``
    (:func:`harness.runfolder.sample_names`)."""
    names, sample_set = set(valid), set(samples)
    return [g for g in gates if g.figure not in (sample_set if g.distribution else names)]


def needs_baseline(gates: Iterable[Gate]) -> bool:
    """Whether any gate is relative to the baseline."""
    return any(g.relative for g in gates)
