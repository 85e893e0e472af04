"""The ``litellm`` proxy kind: the LiteLLM proxy (PyPI ``litellm[proxy]``) in front of the
target, configured by a rendered ``config.yaml``.

Options are named after LiteLLM's own settings (https://docs.litellm.ai/docs/proxy/configs):
one ``model_list`` entry routes every model name (``"*"``) to the target as an
OpenAI-compatible server (``litellm_params.model = "<provider>/*"``, ``api_base`` the target's
``/v1``; ``provider`` ``hosted_vllm``, LiteLLM's provider for vLLM, or ``openai``), with its
``timeout`` and ``stream_timeout``; ``litellm_settings.drop_params`` drops request parameters
the provider does not take (vLLM's ``ignore_eos`` and ``min_tokens`` among them, unless the
provider passes them); ``general_settings.cancel_on_disconnect`` (LiteLLM PR #30223, opt-in)
makes the proxy close its upstream request when its client disconnects (``None``: not written,
the installed version's default); ``forward_client_headers_to_llm_api`` passes the clients'
``x-`` headers on, so the engine names each request after its ``X-Request-Id`` as it does
without a gateway. The load sends no API key: the proxy runs without a master
key (``general_settings.dangerously_permit_weak_or_unset_master_key``, for a gateway the run
starts on its own address). It runs one worker and never reaches outside the run:
``LITELLM_LOCAL_MODEL_COST_MAP`` keeps it from fetching its model cost map, and it has no
database. Readiness is its own ``GET /health/liveliness`` (``/health`` would call the model).

``prometheus`` adds ``litellm_settings.callbacks: ["prometheus"]``: LiteLLM then serves its own
Prometheus metrics at ``/metrics/`` on its port (``PrometheusLogger._mount_metrics_endpoint`` in
litellm/integrations/prometheus.py; 1.108 needs no licence for them), without authentication
(``litellm_settings.require_auth_for_metrics_endpoint: false``). It needs ``prometheus-client``
in LiteLLM's environment (``make setup`` installs it; LiteLLM does not start without it), and
the run reads them by :data:`LITELLM_FIGURES`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Literal

import httpx
import yaml
from pydantic import Field

from harness.servers._base import PROXIES, Proxy, ProxyConfigBase
from harness.servers._configured import ConfiguredProxy
from harness.servers._proxy_metrics import ProxyFigure
from zwcore import TargetError

LITELLM_FIGURES = (
    ProxyFigure("requests", "litellm_proxy_total_requests_metric_total", "counter"),
    ProxyFigure("failed_requests", "litellm_proxy_failed_requests_metric_total", "counter"),
    ProxyFigure("in_flight_requests", "litellm_in_flight_requests", "gauge"),
)
"""LiteLLM's own figures (1.108): client requests the proxy finished (successful and failed)
and those that failed (litellm/integrations/prometheus.py, ``litellm_proxy_total_requests_metric``
and ``litellm_proxy_failed_requests_metric``), and HTTP requests in flight on its worker
(litellm/proxy/middleware/in_flight_requests_middleware.py: every HTTP request, the scrape that
reads it included, so it is at least 1). Measured (``scenarios/incidents/litellm-disconnect.toml``
and ``tests/test_command_kinds.py``): a client that leaves before its whole answer counts as a
success as LiteLLM ships (it finishes the request upstream) and as a failure with
``cancel_on_disconnect`` (its 499); a stream whose client left mid-stream is not counted at all
by the end of the run."""
METRIC_NAMES_QUERY = "&".join(f"name[]={f.metric}" for f in LITELLM_FIGURES)
"""``/metrics/`` renders only these samples (``name[]`` parameters,
litellm/integrations/prometheus_metrics_endpoint.py): a whole registry at every probe would
load the gateway under test."""


@PROXIES.register
class LitellmProxyConfig(ProxyConfigBase):
    """The LiteLLM proxy as a gateway in front of the target. Times in seconds; see the
    module docstring for each field."""

    kind: Literal["litellm"] = "litellm"
    provider: Literal["hosted_vllm", "openai"] = Field(
        "hosted_vllm", description="litellm_params.model's provider prefix"
    )
    cancel_on_disconnect: bool | None = Field(
        None, description="general_settings.cancel_on_disconnect (None: not written)"
    )
    timeout_s: float = Field(600.0, gt=0, description="litellm_params.timeout")
    stream_timeout_s: float = Field(600.0, gt=0, description="litellm_params.stream_timeout")
    drop_params: bool = Field(True, description="litellm_settings.drop_params")
    num_retries: int = Field(0, ge=0, description="litellm_settings.num_retries")
    forward_client_headers: bool = Field(
        True,
        description="general_settings.forward_client_headers_to_llm_api: the clients' x- "
        "headers reach the target, X-Request-Id among them (the engine's records join the "
        "requests by it)",
    )
    prometheus: bool = Field(
        True,
        description='litellm_settings.callbacks: ["prometheus"], served at /metrics/ without '
        "authentication (needs prometheus-client in LiteLLM's environment)",
    )
    listen_host: str = "127.0.0.1"
    listen_port: int = Field(0, ge=0, le=65535, description="0 picks a free port")
    binary: str = "litellm"
    startup_timeout_s: float = Field(90.0, gt=0)

    def build(self) -> Proxy:
        return LitellmProxy(self)


def litellm_config(config: LitellmProxyConfig, *, upstream_url: str) -> dict[str, Any]:
    """LiteLLM's ``config.yaml`` as plain data: every model name routed to ``upstream_url``
    (``http://host:port``) as an OpenAI-compatible server."""
    c = config
    # the load sends no key: a gateway started for the run on its own address needs none
    general: dict[str, Any] = {
        "dangerously_permit_weak_or_unset_master_key": True,
        "forward_client_headers_to_llm_api": c.forward_client_headers,
    }
    if c.cancel_on_disconnect is not None:
        general["cancel_on_disconnect"] = c.cancel_on_disconnect
    settings: dict[str, Any] = {
        "drop_params": c.drop_params,
        "num_retries": c.num_retries,
        "telemetry": False,
    }
    if c.prometheus:
        settings.update(callbacks=["prometheus"], require_auth_for_metrics_endpoint=False)
    return {
        "model_list": [
            {
                "model_name": "*",
                "litellm_params": {
                    "model": f"{c.provider}/*",
                    "api_base": f"{upstream_url}/v1",
                    "api_key": "none",
                    "timeout": c.timeout_s,
                    "stream_timeout": c.stream_timeout_s,
                },
            }
        ],
        "litellm_settings": settings,
        "general_settings": general,
    }


class LitellmProxy(ConfiguredProxy):
    """The LiteLLM proxy started for the run (one worker); its ``config.yaml`` and log are in
    ``<run>/litellm/``, its metrics (with ``prometheus``) at :attr:`metrics_url`."""

    kind = "litellm"
    metric_figures: ClassVar[tuple[ProxyFigure, ...]] = LITELLM_FIGURES
    label = "litellm"
    binary_hint = "pip install 'litellm[proxy]' prometheus-client"
    conf_name = "config.yaml"
    ready_path: ClassVar[str | None] = "/health/liveliness"

    def __init__(self, config: LitellmProxyConfig) -> None:
        super().__init__(config)
        host = f"[{config.listen_host}]" if ":" in config.listen_host else config.listen_host
        if config.prometheus:
            self.metrics_url = f"http://{host}:{self.port}/metrics/?{METRIC_NAMES_QUERY}"

    def start(self, run_dir: Path, upstream_url: str) -> str:
        """Start it as every configured proxy (``ConfiguredProxy.start``), then, with
        ``prometheus``, ask its metrics once: LiteLLM 1.108 answers its first ``/metrics/``
        after about a second and later ones within milliseconds (measured here), and the
        probe's scrapes give up sooner. Raises :class:`~zwcore.TargetError` when they do not
        answer 2xx within ``startup_timeout_s`` (it is stopped)."""
        url = super().start(run_dir, upstream_url)
        if self.metrics_url is not None:
            try:
                response = httpx.get(self.metrics_url, timeout=self.config.startup_timeout_s)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                self.stop()
                raise TargetError(f"litellm: {self.metrics_url} did not answer: {exc}") from None
        return url

    def render(self, folder: Path, upstream_host: str, upstream_port: int) -> str:
        host = f"[{upstream_host}]" if ":" in upstream_host else upstream_host
        data = litellm_config(self.config, upstream_url=f"http://{host}:{upstream_port}")
        return "# Rendered by zerowindow for this run.\n" + yaml.safe_dump(data, sort_keys=False)

    def launch_env(self) -> dict[str, str]:
        return {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "WARNING"}

    def build_argv(self, binary: str, conf: Path, folder: Path) -> list[str]:
        return [
            binary, "--config", str(conf), "--host", self.config.listen_host,
            "--port", str(self.port), "--num_workers", "1",
        ]  # fmt: skip
