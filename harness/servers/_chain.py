"""The ``chain`` proxy kind: several proxies one behind the other (an ingress, then a gateway,
then the engine), each with its own buffering, timeouts and way of passing an abort on.

``hops`` lists them from the clients' side inward: the first faces the clients, the last
forwards to the target. They start inside out (each is given the URL of the hop behind it) and
stop outside in; each keeps its files in ``<run>/hops/<i>-<kind>/``. The run probes every hop
as it probes a single proxy (:meth:`ChainProxy.probe_hops`: its process tree's memory, its
Send-Q toward the hop in front of it, its Recv-Q from the hop behind it, its spilled bytes and
its own metrics, in ``proxy.parquet`` by ``hop``), and samples the sockets of every hop's
listening port (``sockets.parquet``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from harness.servers._base import (
    PROXIES,
    Proxy,
    ProxyConfig,
    ProxyConfigBase,
    ProxyHop,
    make_proxy,
)
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

    def hop_kinds(self) -> list[str]:
        """Its hops' kinds, the clients' side first."""
        return [k for hop in self.hops for k in hop.hop_kinds()]


class ChainProxy(Proxy):
    """The hops of a ``chain``: what the run asks of processes goes to all of them, what it
    probes is asked of each (:meth:`probe_hops`). It has no metrics of its own."""

    kind = "chain"

    def __init__(self, config: ChainProxyConfig) -> None:
        self.config = config
        self.hops = [make_proxy(h) for h in config.hops]
        self.urls: list[str | None] = [None] * len(self.hops)

    @staticmethod
    def hop_folder(run_dir: Path, index: int, hop: Proxy) -> Path:
        """Where hop ``index`` keeps its files: ``<run_dir>/hops/<index>-<kind>/``."""
        return run_dir / "hops" / f"{index}-{hop.kind}"

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Start the hops inside out; return the first hop's URL. Raises
        :class:`~zwcore.TargetError` naming the hop that did not start (the ones started are
        stopped)."""
        url = upstream_url
        for i in reversed(range(len(self.hops))):
            hop = self.hops[i]
            folder = self.hop_folder(run_dir, i, hop)
            folder.mkdir(parents=True, exist_ok=True)
            try:
                url = self.urls[i] = hop.start(folder, url)
            except TargetError as exc:
                self.stop()
                raise TargetError(f"chain hop {i} ({hop.kind}): {exc}") from None
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

    def probe_hops(self, run_dir: Path, client_url: str, upstream_url: str) -> list[ProxyHop]:
        """Every started hop, each probed as a single proxy (its own pid, metrics and spill
        folder under ``hops/<i>-<kind>/``), listening at its own URL, its upstream the next
        hop's (the last hop's: ``upstream_url``); ``index`` is its place in the chain."""
        upstreams = [*self.urls[1:], upstream_url]
        out = []
        for i, (hop, url, up) in enumerate(zip(self.hops, self.urls, upstreams, strict=True)):
            if url is not None and up is not None:
                for probed in hop.probe_hops(self.hop_folder(run_dir, i, hop), url, up):
                    out.append(replace(probed, index=i))
        return out

    def describe(self) -> dict[str, Any]:
        hops = [
            {**hop.describe(), "url": url} for hop, url in zip(self.hops, self.urls, strict=True)
        ]
        return {"kind": self.kind, "hops": hops}
