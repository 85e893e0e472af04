"""CPU placement of a run: the target on one CPU set, the load, the harness and the proxies on
another (``[placement]``, :class:`~harness.scenario.PlacementConfig`).

The harness pins its threads to the load set while the run lasts, so every process it
starts inherits that set (Locust processes, distributed workers, proxies); the target's
processes are started on the target set instead (``ServerProcess.cpus``), and what they fork
later inherits it. Affinity is the kernel's ``sched_setaffinity(2)``; a process may widen its
own set again, so vLLM's CPU build, which binds its OpenMP threads itself, is told the target
set through ``VLLM_CPU_OMP_THREADS_BIND`` (``harness.servers._vllm``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from harness.scenario import PlacementConfig, ScenarioError
from harness.servers import ServerProcess
from zwcore import format_cpu_list


@dataclass(frozen=True)
class Placement:
    """The CPU sets of one run: ``target_cpus`` and ``load_cpus`` (``None`` for both when no
    placement is applied), the CPUs the run could use (``available``) and ``reason``: how the
    sets were chosen, or why there are none."""

    target_cpus: tuple[int, ...] | None
    load_cpus: tuple[int, ...] | None
    available: tuple[int, ...]
    reason: str

    @property
    def applied(self) -> bool:
        return self.target_cpus is not None

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` keeps under ``placement``."""
        return {
            "applied": self.applied,
            "target_cpus": None if self.target_cpus is None else format_cpu_list(self.target_cpus),
            "load_cpus": None if self.load_cpus is None else format_cpu_list(self.load_cpus),
            "available_cpus": format_cpu_list(self.available),
            "reason": self.reason,
        }


def usable_cpus() -> tuple[int, ...]:
    """The CPUs this process may run on (``sched_getaffinity(2)``), sorted."""
    return tuple(sorted(os.sched_getaffinity(0)))


def plan_placement(
    config: PlacementConfig,
    *,
    available: tuple[int, ...] | None = None,
    target_started: bool = True,
) -> Placement:
    """Choose the CPU sets of a run from ``config`` among ``available`` (default: this
    process's usable CPUs). A target the run does not start (``target_started=False``: a
    ``url`` target) has nothing to place: the load keeps every CPU, or the ``load_cpus`` the
    scenario names. Raises
    :class:`ScenarioError` when a set names a CPU that is not usable or leaves the other set
    empty."""
    cpus = available if available is not None else usable_cpus()
    if not config.enabled:
        return Placement(None, None, cpus, "off ([placement] enabled = false)")
    target, load = config.target_cpus, config.load_cpus
    for field, chosen in (("target_cpus", target), ("load_cpus", load)):
        if chosen and (outside := set(chosen) - set(cpus)):
            raise ScenarioError(
                f"placement.{field}: CPU {format_cpu_list(outside)} is not usable here "
                f"(usable: {format_cpu_list(cpus)})"
            )
    if not target_started:
        why = "the run does not start the target"
        if load:
            return Placement(None, load, cpus, f"load only, as set in [placement]: {why}")
        return Placement(None, None, cpus, f"none: {why}")
    if target is None and load is None:
        if len(cpus) < 2:
            return Placement(None, None, cpus, f"impossible: {len(cpus)} usable CPU")
        half = (len(cpus) + 1) // 2
        return Placement(cpus[:half], cpus[half:], cpus, "auto: usable CPUs split in two")
    target = target or tuple(c for c in cpus if c not in set(load or ()))
    load = load or tuple(c for c in cpus if c not in set(target))
    if not target or not load:
        empty = "target_cpus" if not target else "load_cpus"
        raise ScenarioError(f"placement.{empty}: no usable CPU is left for it")
    return Placement(target, load, cpus, "set in [placement]")


def place_target(placement: Placement, processes: list[ServerProcess]) -> None:
    """Have the target's ``processes`` start on the target set (when a placement applies)."""
    if placement.target_cpus is not None:
        for process in processes:
            process.cpus = placement.target_cpus


@contextmanager
def pinned_to_load(placement: Placement) -> Iterator[None]:
    """Run the block with every thread of this process on the load set (threads started in
    the block inherit it from their creator, and so do the processes it starts); each thread's
    previous set is restored afterwards."""
    if placement.load_cpus is None:
        yield
        return
    before = {tid: _affinity(tid) for tid in _threads()}
    for tid in before:
        _set_affinity(tid, placement.load_cpus)
    try:
        yield
    finally:
        for tid, cpus in before.items():
            if cpus is not None:
                _set_affinity(tid, cpus)


def _threads() -> list[int]:
    """This process's thread ids (``/proc/self/task``, proc(5))."""
    return [int(t) for t in os.listdir("/proc/self/task")]


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:  # the thread ended
        return None


def _set_affinity(tid: int, cpus: Iterable[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError:  # the thread ended meanwhile
        pass
