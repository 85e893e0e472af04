"""HTTP clients of the harness (scrapes, probes, readiness and health checks), sharing one TLS
context.

``httpx.Client()`` builds a new ``ssl.SSLContext`` and loads the CA bundle into it each time
(~30 ms of CPU on this 2-CPU machine), although the servers a run starts speak plain HTTP; a
run makes several clients. The context is built once, on the first client, with the trust
httpx uses by default (certifi's bundle), so an ``https`` url target is verified as before.
"""

from __future__ import annotations

import functools
import ssl

import certifi
import httpx


@functools.cache
def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


def http_client(*, timeout: float) -> httpx.Client:
    """A new ``httpx.Client`` with ``timeout`` (s) and the shared TLS context."""
    return httpx.Client(timeout=timeout, verify=_tls_context())
