"""Open-loop arrivals: when a group's requests are sent, whatever the server does meanwhile.

A group with ``arrival`` sends requests on a schedule computed before the load starts (from
the scenario's seed: the same seed gives the same schedule, to the nanosecond), instead of
``users`` users sending one request after another (the closed loop, where a slow server
slows the senders down and hides its own latency: coordinated omission). Each request's
record keeps ``t_scheduled``, the deadline it was meant to go at, beside ``t_send``.

Every kind sends its first request at the start (offset 0) and then waits a gap before each
next one; the gaps' mean is ``1 / rate_rps``:

- ``constant``: every gap is exactly ``1 / rate_rps``. (inference-perf's "constant" draws
  exponential gaps; that is our ``poisson``.)
- ``poisson``: exponential gaps (a Poisson process), as ``vllm bench serve --request-rate``
  with burstiness 1.
- ``gamma``: gamma gaps of shape ``burstiness`` and scale ``1 / (rate_rps * burstiness)``
  (mean ``1 / rate_rps``, coefficient of variation ``1 / sqrt(burstiness)``), vLLM's definition
  of ``--burstiness`` (vllm/benchmarks/serve.py, ``get_request``): below 1 burstier than
  Poisson, above 1 more regular. Unlike recent vLLM, the gaps are not rescaled afterwards to
  make the run last exactly ``requests / rate_rps``.

``requests`` and ``duration_s`` bound the schedule (whichever ends it first). ``ramp_s``
warps time so that the rate rises linearly from 0 to ``rate_rps`` over the first ``ramp_s``
seconds (the gaps are drawn at ``rate_rps`` and stretched by the ramp). ``max_concurrency``
caps the requests in flight: a request whose deadline comes while the cap is reached waits
for a free slot, and that wait is part of its send lag (``t_send - t_scheduled``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from zwcore import Registry

# A duration-bounded schedule is drawn in batches of this many gaps.
_BATCH = 4096
T = TypeVar("T")


@dataclass(frozen=True)
class PlannedRequest:
    """One request of an open-loop plan: when it goes (``offset_s`` from the start) and what
    a trace says of it (``None``/empty: the group's own settings). ``prefix_blocks``: ids of
    the prompt's blocks of ``block_tokens`` tokens each (a trace's ``hash_ids``): requests
    that share leading ids share that prefix. ``behaviour``: how the client reads and acts
    (a resolved :class:`~loadgen._config.ClientMixEntry`, when a run is replayed)."""

    offset_s: float
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    prefix_blocks: tuple[int, ...] = ()
    behaviour: Any = None
    block_tokens: int = 512


class ArrivalBase(BaseModel):
    """An open-loop arrival process (a kind subclasses this and registers with
    :data:`ARRIVALS`): :meth:`plan` gives every request, ``max_concurrency`` caps those in
    flight."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str
    max_concurrency: int | None = Field(
        None, ge=1, description="requests in flight at most; later ones wait (send lag)"
    )

    def plan(self, seed: int) -> list[PlannedRequest]:
        """Every request, in send order (offsets ascending, the first 0.0)."""
        raise NotImplementedError


class RateArrivals(ArrivalBase):
    """Shared fields of the rate-driven processes (see the module docstring): ``rate_rps``
    (requests per second at full rate), ``requests`` and/or ``duration_s`` (at least one),
    ``ramp_s``. Raises ``pydantic.ValidationError`` for out-of-range values or neither
    bound."""

    rate_rps: float = Field(gt=0, description="requests per second once the ramp is over")
    requests: int | None = Field(None, ge=1, description="how many requests in all")
    duration_s: float | None = Field(
        None, gt=0, description="no request is scheduled this long after the start or later"
    )
    ramp_s: float = Field(0.0, ge=0, description="the rate rises linearly from 0 over this")

    @model_validator(mode="after")
    def _bounded(self) -> RateArrivals:
        if self.requests is None and self.duration_s is None:
            raise ValueError("an arrival process needs requests, duration_s or both")
        return self

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` gaps (s) between consecutive requests at ``rate_rps``."""
        raise NotImplementedError

    def plan(self, seed: int) -> list[PlannedRequest]:
        return [PlannedRequest(t) for t in self.schedule(seed)]

    def schedule(self, seed: int) -> list[float]:
        """The send offsets (s from the start, ascending, the first 0.0) of every request,
        drawn from ``numpy.random.default_rng(seed)``."""
        rng = np.random.default_rng(seed)
        if self.requests is not None:
            times = self._warp(_offsets(self.gaps(rng, self.requests - 1)))
        else:
            times = self._warp(np.zeros(1))
            while self.duration_s is not None and times[-1] < self.duration_s:
                more = self.gaps(rng, _BATCH)
                start = self._unwarp(times[-1])
                times = np.concatenate([times, self._warp(start + np.cumsum(more))])
        if self.duration_s is not None:
            times = times[times < self.duration_s]
        return [float(t) for t in times]

    def expected_requests(self) -> float:
        """About how many requests the schedule holds (``requests``, else the rate integrated
        over ``duration_s``, ramp included)."""
        if self.requests is not None:
            return float(self.requests)
        assert self.duration_s is not None
        return math.ceil(self.rate_rps * self._unwarp(self.duration_s))

    def _warp(self, u: np.ndarray) -> np.ndarray:
        """Offsets at full rate (``u``) as offsets under the ramp: the inverse of the ramp's
        cumulative rate ``rate * t^2 / (2 ramp)`` before ``ramp_s``, ``rate * (t - ramp / 2)``
        after, both divided by ``rate``."""
        r = self.ramp_s
        if r == 0:
            return u
        return np.where(u < r / 2, np.sqrt(2 * r * np.maximum(u, 0)), u + r / 2)

    def _unwarp(self, t: float) -> float:
        r = self.ramp_s
        if r == 0:
            return t
        return t * t / (2 * r) if t < r else t - r / 2


def _offsets(gaps: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(gaps)])


ARRIVALS: Registry[ArrivalBase] = Registry("arrival process")


@ARRIVALS.register
class ConstantArrivals(RateArrivals):
    """Every gap exactly ``1 / rate_rps``."""

    kind: Literal["constant"] = "constant"

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, 1.0 / self.rate_rps)


@ARRIVALS.register
class PoissonArrivals(RateArrivals):
    """Exponential gaps of mean ``1 / rate_rps`` (a Poisson process)."""

    kind: Literal["poisson"] = "poisson"

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.exponential(1.0 / self.rate_rps, n)


@ARRIVALS.register
class GammaArrivals(RateArrivals):
    """Gamma gaps, shape ``burstiness``, mean ``1 / rate_rps`` (vLLM's ``--burstiness``)."""

    kind: Literal["gamma"] = "gamma"
    burstiness: float = Field(
        1.0, gt=0, description="gamma shape: < 1 burstier than Poisson, > 1 more regular"
    )

    def gaps(self, rng: np.random.Generator, n: int) -> np.ndarray:
        k = self.burstiness
        return rng.gamma(k, 1.0 / (self.rate_rps * k), n)


ArrivalConfig = Annotated[ArrivalBase, ARRIVALS.validator, ARRIVALS.serializer]
"""A field holding any registered arrival process, chosen by its ``kind``."""


def share(plan: list[T], index: int, count: int) -> list[tuple[int, T]]:
    """The requests of one of ``count`` load processes (``index`` from 0): every
    ``count``-th item of ``plan`` from the ``index``-th, with its position in the whole plan.
    Together the shares hold every request exactly once. Raises ``ValueError`` for an index
    outside ``[0, count)``."""
    if not 0 <= index < count:
        raise ValueError(f"share {index} of {count} does not exist")
    return [(i, plan[i]) for i in range(index, len(plan), count)]
