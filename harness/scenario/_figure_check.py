"""A scenario's gates as fields: each written and read as its text, held parsed, and checked
against the figures the scenario can have (its groups', its proxies' hops', with a control arm
the impact figures), so that a misspelt figure is an error at load with a close valid name."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import PlainSerializer, PlainValidator
from pydantic_core import PydanticCustomError

from harness.runfolder import figure_names, hop_figure_names, impact_names, sample_names
from harness.scenario._gate_syntax import Gate, GateSyntaxError, parse_gate, unknown_figures
from harness.servers import ProxyConfigBase, hop_metric_names
from loadgen import UserGroupConfig


def _gate(value: Any) -> Gate:
    if isinstance(value, Gate):
        return value
    try:
        return parse_gate(value)
    except GateSyntaxError as exc:
        raise PydanticCustomError("gate_syntax", "{reason}", {"reason": str(exc)}) from None


# A gate in a scenario: written and read as its text, held parsed (harness.scenario._gate_syntax).
GateField = Annotated[Gate, PlainValidator(_gate), PlainSerializer(str, return_type=str)]


def _listing(names: list[str], owners: list[str]) -> str:
    """``names`` for an error message: the run's own figures, then every owner's figures once
    (``<owner>.<figure>`` for the owners and figures listed), not each owner's spelt out."""
    per_owner = {n[len(o) + 1 :] for o in owners for n in names if n.startswith(f"{o}.")}
    if not per_owner or len(owners) < 2:
        return ", ".join(names)
    own = [n for n in names if not any(n.startswith(f"{o}.") for o in owners)]
    return (
        f"{', '.join(own)}; and <owner>.<name> for owner in {', '.join(owners)}; name in "
        f"{', '.join(sorted(per_owner))}"
    )


def hop_figures(proxies: Sequence[ProxyConfigBase]) -> list[str]:
    """The ``proxy.hop<i>.<name>`` figures of a scenario whose proxy configurations are
    ``proxies``: as many hops as the longest path has, each with its sizes and the own metrics
    of every kind found at that place (:func:`harness.servers.hop_metric_names`)."""
    paths = [p.hop_kinds() for p in proxies]
    out: list[str] = []
    for i in range(max(map(len, paths), default=0)):
        metrics = {m for path in paths if i < len(path) for m in hop_metric_names(path[i])}
        out += hop_figure_names(i, metrics)
    return out


def check_figures(
    gates: list[Gate],
    groups: list[UserGroupConfig],
    *,
    control: bool = False,
    proxies: Sequence[ProxyConfigBase] = (),
) -> None:
    """Raise a ``PydanticCustomError`` (``unknown_figure``) for the first gate whose figure
    is not one of ``groups``' figures (:func:`harness.runfolder.figure_names`; with a
    ``control`` arm also the impact figures of the groups that are not aggressors; with
    ``proxies``, the scenario's proxy configurations, their hops' figures, :func:`hop_figures`)."""
    owners = [g.name for g in groups] + [o for g in groups for o in g.owners()]
    valid, samples = figure_names(owners), sample_names(owners)
    if proxies:
        valid = sorted(valid + hop_figures(proxies))
    if control:
        valid = sorted(valid + impact_names(g.name for g in groups if not g.aggressor))
    for gate in unknown_figures(gates, valid, samples):
        names = samples if gate.distribution else valid
        close = difflib.get_close_matches(gate.figure, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        if gate.figure.startswith("impact.") and not control:
            hint = " (impact figures need control = true and a group with aggressor = true)"
        what = "sample" if gate.distribution else "figure"
        raise PydanticCustomError(
            "unknown_figure",
            "gate {quoted_gate}: unknown {what} {figure}{hint}; valid {what}s: {valid}",
            {
                "gate": gate.text,
                "quoted_gate": repr(gate.text),
                "figure": repr(gate.figure),
                "what": what,
                "hint": hint,
                "valid": _listing(names, owners),
                "gate_index": gates.index(gate),
            },
        )
