"""Readiness of a server the run does not start (a ``url`` target): what has to answer before
the load begins. A kind is a small frozen model registered with :data:`READINESS`.

- ``auto`` (the default): ``GET /health`` answering 200 (vLLM, SGLang, llama.cpp's server),
  else ``GET /v1/models`` answering 200 (most other OpenAI-compatible servers and gateways);
- ``http``: ``GET`` of ``path`` answering one of ``statuses``, e.g. ``statuses = [200, 500]``
  to load-test a server that is sick on purpose, or ``path = "/v1/models"`` with 401 for a
  gateway that wants a key;
- ``completion``: a one-token, non-streamed ``POST /v1/completions`` for the scenario's model
  answering 200 (the model is loaded and generates);
- ``none``: nothing is checked.

The run records what answered (``run.json``, ``target.readiness``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field

from zwcore import Registry, TargetError, http_client

_POLL_S = 0.5
_REQUEST_TIMEOUT_S = 2.0


class Readiness(BaseModel):
    """How to tell that a server is ready (a kind subclasses this, registered with
    :data:`READINESS`): :meth:`check` asks once."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: str

    def check(self, client: httpx.Client, base_url: str, *, model: str) -> tuple[bool, str]:
        """Ask the server once: (ready, what it answered). Raises ``httpx.HTTPError`` when
        nothing answers."""
        raise NotImplementedError


READINESS: Registry[Readiness] = Registry("readiness")


def _get(client: httpx.Client, base_url: str, path: str) -> int:
    return client.get(f"{base_url}{path}").status_code


@READINESS.register
class AutoReadiness(Readiness):
    """``GET /health`` answering 200, else ``GET /v1/models`` answering 200."""

    kind: Literal["auto"] = "auto"

    def check(self, client: httpx.Client, base_url: str, *, model: str) -> tuple[bool, str]:
        health = _get(client, base_url, "/health")
        if health == 200:
            return True, "GET /health answered 200"
        models = _get(client, base_url, "/v1/models")
        said = f"GET /v1/models answered {models} (GET /health: {health})"
        return models == 200, said


@READINESS.register
class HttpReadiness(Readiness):
    """``GET`` of ``path`` answering one of ``statuses``. Validation errors: a path that does
    not begin with ``/``, an empty list, a status outside 100..599."""

    kind: Literal["http"] = "http"
    path: str = Field("/health", pattern=r"^/")
    statuses: list[Annotated[int, Field(ge=100, le=599)]] = Field([200], min_length=1)

    def check(self, client: httpx.Client, base_url: str, *, model: str) -> tuple[bool, str]:
        status = _get(client, base_url, self.path)
        return status in self.statuses, f"GET {self.path} answered {status}"


@READINESS.register
class CompletionReadiness(Readiness):
    """A one-token, non-streamed ``POST /v1/completions`` for the run's model answering 200."""

    kind: Literal["completion"] = "completion"

    def check(self, client: httpx.Client, base_url: str, *, model: str) -> tuple[bool, str]:
        body = {"model": model, "prompt": "ready?", "max_tokens": 1, "stream": False}
        status = client.post(f"{base_url}/v1/completions", json=body).status_code
        return status == 200, f"POST /v1/completions (max_tokens 1) answered {status}"


@READINESS.register
class NoReadiness(Readiness):
    """Nothing is checked: the load starts at once."""

    kind: Literal["none"] = "none"

    def check(self, client: httpx.Client, base_url: str, *, model: str) -> tuple[bool, str]:
        return True, "not checked (readiness none)"


ReadinessConfig = Annotated[Readiness, READINESS.validator, READINESS.serializer]
"""A field holding any registered readiness kind, chosen by its ``kind``."""


def wait_ready(
    readiness: Readiness,
    base_url: str,
    *,
    model: str,
    timeout_s: float,
    alive: Callable[[], str | None] | None = None,
) -> str:
    """Ask every 0.5 s until ``readiness`` says ready; return what answered, with the time
    it took. ``alive`` (optional) gives why the server died, or ``None`` while it runs: asking
    stops then. Raises :class:`~zwcore.TargetError` naming the last answer after ``timeout_s``,
    or why the server died."""
    t0 = time.monotonic()
    last = "no answer yet"
    with http_client(timeout=_REQUEST_TIMEOUT_S) as client:
        while True:
            if alive is not None and (reason := alive()):
                raise TargetError(f"failed while starting: {reason} (last: {last})")
            try:
                ready, last = readiness.check(client, base_url, model=model)
            except httpx.HTTPError as exc:
                ready, last = False, f"{type(exc).__name__} ({exc})"
            if ready:
                return f"{last} after {time.monotonic() - t0:.1f} s"
            if time.monotonic() - t0 + _POLL_S > timeout_s:
                break
            time.sleep(_POLL_S)
    raise TargetError(
        f"{base_url} not ready within {timeout_s:g} s by readiness {readiness.kind!r} "
        f"(last: {last}); [target] readiness sets what must answer (auto, http with a path "
        "and statuses, completion, none)"
    )
