"""The ``none`` proxy kind: clients talk to the target directly."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar, Literal

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase, ProxyHop


@PROXIES.register
class NoProxyConfig(ProxyConfigBase):
    """Clients talk to the target directly."""

    kind: Literal["none"] = "none"

    def build(self) -> Proxy:
        return NoProxy(self)

    def hop_kinds(self) -> list[str]:
        """None: nothing stands between the clients and the target."""
        return []

    @classmethod
    def for_bench(cls, *, client_sndbuf_bytes: int) -> dict[str, ProxyConfigBase]:
        """``none``: the direct path, the baseline of the latency every proxy adds."""
        return {"none": cls()}


class NoProxy(Proxy):
    """No proxy: clients use the target's URL."""

    kind: ClassVar[str] = "none"

    def __init__(self, config: NoProxyConfig) -> None:
        self.config = config

    def start(self, run_dir: Path, upstream_url: str) -> str:
        return upstream_url

    def probe_hops(self, run_dir: Path, client_url: str, upstream_url: str) -> list[ProxyHop]:
        """None: nothing stands between the clients and the target."""
        return []
