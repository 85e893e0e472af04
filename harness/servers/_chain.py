"""The ``chain`` proxy kind: several proxies one behind the other (an ingress, then a gateway,
then the engine), each with its own buffering, timeouts and way of passing an abort on.

``hops`` lists them from the clients' side inward: the first faces the clients, the last
forwards to the target. They start inside out (each is given the URL of the hop behind it) and
stop outside in; each keeps its files in ``<run>/hops/<i>-<kind>/``. The run samples the
sockets of every hop's listening port (``sockets.parquet``: each hop's Send-Q toward the hop
in front of it), and probes the first hop as it probes a single proxy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator

from harness.servers._base import PROXIES, Proxy, ProxyConfig, ProxyConfigBase, make_proxy
from harness.servers._process import ServerProcess
from zwcore import TargetError


@PROXIES.register
class ChainProxyConfig(ProxyConfigBase):
    """Proxies one behind the other: ``hops``, from the clients' side inward (at least two;
    neither ``none`` nor a chain among them)."""

    kind: Literal["chain"] = "chain"
    hops: list[ProxyConfig] = Field(
        ..., min_length=2, description="the proxies, from the clients' side inward"
    )

    @field_validator("hops")
    @classmethod
    def _real_hops(cls, hops: list[ProxyConfigBase]) -> list[ProxyConfigBase]:
        for i, hop in enumerate(hops):
            if hop.kind in ("none", "chain"):
                raise ValueError(f"hop {i}: kind {hop.kind!r} cannot be a hop of a chain")
        return hops

    def build(self) -> Proxy:
        return ChainProxy(self)


class ChainProxy(Proxy):
    """The hops of a ``chain``; what the run asks of a proxy goes to the first hop (its pid,
    metrics, spill folder), what it asks of processes to all of them."""

    kind = "chain"

    def __init__(self, config: ChainProxyConfig) -> None:
        self.config = config
        self.hops = [make_proxy(h) for h in config.hops]
        self.urls: list[str | None] = [None] * len(self.hops)
        self.metrics_url = self.hops[0].metrics_url

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Start the hops inside out; return the first hop's URL. Raises
        :class:`~zwcore.TargetError` naming the hop that did not start (the ones started are
        stopped)."""
        url = upstream_url
        for i in reversed(range(len(self.hops))):
            hop = self.hops[i]
            folder = run_dir / "hops" / f"{i}-{hop.kind}"
            folder.mkdir(parents=True, exist_ok=True)
            try:
                url = self.urls[i] = hop.start(folder, url)
            except TargetError as exc:
                self.stop()
                raise TargetError(f"chain hop {i} ({hop.kind}): {exc}") from None
        self.metrics_url = self.hops[0].metrics_url
        return url

    def processes(self) -> list[ServerProcess]:
        return [p for hop in self.hops for p in hop.processes()]

    def failure(self) -> str | None:
        for i, hop in enumerate(self.hops):
            if self.urls[i] is not None and (reason := hop.failure()):
                return f"chain hop {i} ({hop.kind}): {reason}"
        return None

    def stop(self) -> None:
        for hop in self.hops:
            hop.stop()

    def pid(self) -> int | None:
        return self.hops[0].pid()

    def spill_dir(self, run_dir: Path) -> Path | None:
        return self.hops[0].spill_dir(run_dir / "hops" / f"0-{self.hops[0].kind}")

    def observed_ports(self) -> list[int]:
        """Every hop's listening port."""
        return [port for url in self.urls if url and (port := urlsplit(url).port)]

    def describe(self) -> dict[str, Any]:
        hops = [
            {**hop.describe(), "url": url} for hop, url in zip(self.hops, self.urls, strict=True)
        ]
        return {"kind": self.kind, "hops": hops}
