"""``[placement]``: which CPUs the target and the load get.

On a small machine the engine and the load generator compete for the same CPUs: the client
then timestamps late (ITL collapses to 0, TTFT grows) and the engine's HTTP front-end answers
``/metrics`` late. Giving them disjoint CPU sets fixes most of it (docs/placement.md has the
figures). CPU lists use the kernel's list format of cpuset(7) and taskset(1): ``"0"``,
``"0-3"``, ``"0,2,4-7"``.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, StrictBool, model_validator

from zwcore import format_cpu_list, parse_cpu_list


def _cpus(value: Any) -> Any:
    if isinstance(value, str):
        return parse_cpu_list(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    return value


CpuList = Annotated[tuple[int, ...], BeforeValidator(_cpus)]


class PlacementConfig(BaseModel):
    """``[placement]``: CPU sets for the target and for the load.

    With ``enabled`` (the default) and 2 or more usable CPUs, the run gives the target (every
    process of it, including those it forks later) one set and the load processes, the harness
    and the proxies the other: the first half of the usable CPUs (rounded up) to the target,
    the rest to the load. ``target_cpus`` and ``load_cpus`` (a list such as ``"0-3"``) set
    either or both; the other gets what is left. The sets must not overlap. ``run.json``
    records what was done, or why nothing was.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: StrictBool = True
    target_cpus: CpuList | None = None
    load_cpus: CpuList | None = None

    @model_validator(mode="after")
    def _consistent(self) -> PlacementConfig:
        if not self.enabled and (self.target_cpus or self.load_cpus):
            raise ValueError("target_cpus and load_cpus need enabled = true")
        if self.target_cpus == () or self.load_cpus == ():
            raise ValueError("a CPU list cannot be empty")
        if self.target_cpus and self.load_cpus and set(self.target_cpus) & set(self.load_cpus):
            both = format_cpu_list(set(self.target_cpus) & set(self.load_cpus))
            raise ValueError(f"target_cpus and load_cpus overlap on CPU {both}")
        return self
