"""Proxy kinds: rendered configurations (nginx, haproxy, envoy), presets, the registry, and
each third-party proxy started for real in front of the engine emulator, health-checked
through, and stopped with everything it created."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import pytest
import yaml

from harness._sim import SimConfig, SimServer
from harness.scenario import ScenarioError, parse_scenario
from harness.servers import (
    PROXIES,
    NginxProxyConfig,
    NoProxyConfig,
    ProxyConfigBase,
    make_proxy,
    render_nginx_conf,
)
from harness.servers._configured import find_binary
from harness.servers._envoy import EnvoyProxyConfig, envoy_bootstrap
from harness.servers._haproxy import HaproxyProxyConfig, render_haproxy_cfg
from tests.test_proxy_helpers import needs, param, proxy_config, running_proxy
from zwcore import TargetError, UnknownKindError


@pytest.fixture(scope="module")
def sim() -> Iterator[SimServer]:
    with SimServer(SimConfig(step_fixed_ms=0.5), host="127.0.0.1") as server:
        yield server


# --------------------------------------------------------------------------- nginx


def test_nginx_conf_carries_the_options():
    config = NginxProxyConfig(
        kind="nginx",
        buffering=False,
        send_timeout_s=3,
        reset_timedout_connection=True,
        buffer_size_kb=8,
        max_temp_file_size_mb=0,
        read_timeout_s=30,
        ignore_client_abort=True,
        client_header_timeout_s=2,
        large_header_buffer_kb=4,
    )
    text = render_nginx_conf(config, prefix=Path("/run/x"), port=8081, upstream="127.0.0.1:9")
    for directive in (
        "listen 127.0.0.1:8081;",
        "server 127.0.0.1:9;",
        "proxy_buffering off;",
        "send_timeout 3000ms;",
        "reset_timedout_connection on;",
        "proxy_buffer_size 8k;",
        "proxy_buffers 8 8k;",
        "proxy_max_temp_file_size 0m;",
        "proxy_read_timeout 30000ms;",
        "proxy_ignore_client_abort on;",
        "client_header_timeout 2000ms;",
        "large_client_header_buffers 4 4k;",
        "pid /run/x/nginx.pid;",
        "proxy_temp_path /run/x/proxy_temp;",
    ):
        assert directive in text, directive
    assert text.count("{") == text.count("}")


def test_nginx_presets_fill_unset_options_only():
    sse = NginxProxyConfig(kind="nginx", preset="sse-advice")
    assert sse.buffering is False and sse.send_timeout_s == 60 and not sse.reset_timedout_connection
    reset = NginxProxyConfig(kind="nginx", preset="buffered-reset")
    assert reset.buffering and reset.send_timeout_s == 3 and reset.reset_timedout_connection
    # an option the scenario sets wins over its preset
    mine = NginxProxyConfig(kind="nginx", preset="buffered-reset", send_timeout_s=5)
    assert mine.send_timeout_s == 5 and mine.reset_timedout_connection
    text = render_nginx_conf(reset, prefix=Path("/p"), port=1, upstream="h:2")
    assert "proxy_buffering on;" in text and "send_timeout 3000ms;" in text
    assert "reset_timedout_connection on;" in text


def test_scenario_names_the_bad_nginx_preset(tmp_path):
    text = (
        'name = "x"\n[target]\nkind = "url"\nurl = "http://127.0.0.1:1"\n'
        'served_model_name = "m"\n[proxy]\nkind = "nginx"\npreset = "fast"\n'
        '[[groups]]\nname = "g"\nusers = 1\nrequests_per_user = 1\n'
    )
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, path=tmp_path / "s.toml")
    assert "field 'proxy.preset'" in str(err.value) and ":8:" in str(err.value)


# --------------------------------------------------------------------------- haproxy


def test_haproxy_cfg_carries_the_options():
    config = HaproxyProxyConfig(
        kind="haproxy",
        timeout_client_s=3,
        timeout_server_s=120,
        tune_bufsize=32768,
        abortonclose=True,
        nolinger=True,
        http_no_delay=True,
        timeout_http_request_s=1.5,
    )
    text = render_haproxy_cfg(config, port=8082, upstream_host="127.0.0.1", upstream_port=9)
    for directive in (
        "bind 127.0.0.1:8082",
        "server target 127.0.0.1:9",
        "timeout client 3000ms",
        "timeout server 120000ms",
        "timeout http-request 1500ms",
        "tune.bufsize 32768",
        "    option abortonclose",
        "    option nolinger",
        "    option http-no-delay",
        "mode http",
    ):
        assert directive in text, directive
    default = render_haproxy_cfg(
        HaproxyProxyConfig(kind="haproxy"), port=1, upstream_host="h", upstream_port=2
    )
    assert "no option abortonclose" in default and "no option nolinger" in default


@needs("haproxy")
def test_haproxy_accepts_the_rendered_cfg(tmp_path):
    conf = tmp_path / "haproxy.cfg"
    for config in (
        HaproxyProxyConfig(kind="haproxy"),
        HaproxyProxyConfig(
            kind="haproxy", abortonclose=True, nolinger=True, http_no_delay=True, tune_bufsize=4096
        ),
    ):
        conf.write_text(
            render_haproxy_cfg(config, port=1, upstream_host="127.0.0.1", upstream_port=2)
        )
        check = subprocess.run(
            [find_binary("haproxy", hint=""), "-c", "-f", str(conf)], capture_output=True, text=True
        )
        assert check.returncode == 0, check.stdout + check.stderr


# --------------------------------------------------------------------------- envoy


def _bootstrap(folder: Path = Path("/run/e"), **options: object) -> dict:
    config = EnvoyProxyConfig(kind="envoy", **options)
    return envoy_bootstrap(
        config,
        port=8083,
        admin_port=9901,
        upstream_host="127.0.0.1",
        upstream_port=9,
        folder=folder,
    )


def test_envoy_bootstrap_structure_uses_v3_fields():
    boot = _bootstrap(stream_idle_timeout_s=2.5, buffer_limit_bytes=32768, max_concurrent_streams=7)
    listener = boot["static_resources"]["listeners"][0]
    assert listener["address"] == {"socket_address": {"address": "127.0.0.1", "port_value": 8083}}
    assert listener["per_connection_buffer_limit_bytes"] == 32768
    hcm_filter = listener["filter_chains"][0]["filters"][0]
    assert hcm_filter["name"] == "envoy.filters.network.http_connection_manager"
    hcm = hcm_filter["typed_config"]
    assert hcm["@type"].endswith(".http_connection_manager.v3.HttpConnectionManager")
    assert hcm["stream_idle_timeout"] == "2.500s"
    assert hcm["http2_protocol_options"]["max_concurrent_streams"] == 7
    assert hcm["http_filters"][-1]["name"] == "envoy.filters.http.router"
    route = hcm["route_config"]["virtual_hosts"][0]["routes"][0]
    assert route["match"] == {"prefix": "/"}
    assert route["route"] == {"cluster": "target", "timeout": "0.000s", "idle_timeout": "2.500s"}
    cluster = boot["static_resources"]["clusters"][0]
    assert cluster["name"] == "target" and cluster["type"] == "STATIC"
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"] == {"address": "127.0.0.1", "port_value": 9}
    assert cluster["per_connection_buffer_limit_bytes"] == 32768
    assert boot["admin"]["address"]["socket_address"]["port_value"] == 9901
    # a host name is resolved by DNS, an address is used as it is
    named = EnvoyProxyConfig(kind="envoy")
    dns = envoy_bootstrap(
        named, port=1, admin_port=2, upstream_host="localhost", upstream_port=3, folder=Path("/")
    )
    assert dns["static_resources"]["clusters"][0]["type"] == "STRICT_DNS"


def _envoy_validate(path: Path) -> subprocess.CompletedProcess[str]:
    binary = find_binary("envoy", hint="")
    return subprocess.run(
        [binary, "--mode", "validate", "-c", str(path), "--disable-hot-restart"],
        capture_output=True,
        text=True,
        timeout=120,
    )


@needs("envoy")
def test_envoy_validates_the_rendered_config_and_rejects_a_wrong_field(tmp_path):
    """Envoy's own validation mode parses the file into its v3 Bootstrap proto (unknown
    fields, wrong types and constraint violations fail)."""
    good = tmp_path / "envoy.yaml"
    good.write_text(yaml.safe_dump(_bootstrap(tmp_path, stream_idle_timeout_s=2)))
    result = _envoy_validate(good)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    bad_boot = _bootstrap(tmp_path)
    hcm = bad_boot["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
    hcm["typed_config"]["stream_idle_timout"] = "1s"  # misspelt: not a v3 field
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(bad_boot))
    result = _envoy_validate(bad)
    assert result.returncode != 0
    assert "stream_idle_timout" in result.stdout + result.stderr


# --------------------------------------------------------------------------- registry


def test_registry_builds_by_kind_and_none_passes_the_url_through(tmp_path):
    # tests/kind_tcp_relay.py adds one (test_extending.py), registered when it is collected
    assert set(PROXIES.kinds()) - {"tcp-relay"} == {
        "chain", "command", "egress", "envoy", "haproxy", "litellm", "nginx", "none", "traefik",
    }  # fmt: skip
    proxy = make_proxy(NoProxyConfig())
    assert proxy.start(tmp_path, "http://127.0.0.1:9") == "http://127.0.0.1:9"
    with pytest.raises(UnknownKindError, match="valid kinds: chain, command, egress, envoy"):
        make_proxy(NoProxyConfig.model_construct(kind="squid"))  # type: ignore[arg-type]

    class Impostor(ProxyConfigBase):
        kind: Literal["nginx"] = "nginx"

    with pytest.raises(ValueError, match="already registered"):
        PROXIES.register(Impostor)


@pytest.mark.parametrize("kind", ["haproxy", "envoy"])
def test_scenario_accepts_the_new_kinds_and_names_bad_options(tmp_path, kind):
    base = (
        'name = "x"\n[target]\nkind = "url"\nurl = "http://127.0.0.1:1"\n'
        f'served_model_name = "m"\n[proxy]\nkind = "{kind}"\n'
    )
    groups = '[[groups]]\nname = "g"\nusers = 1\nrequests_per_user = 1\n'
    scenario = parse_scenario(base + groups, path=tmp_path / "s.toml")
    assert scenario.proxy.kind == kind
    with pytest.raises(ScenarioError) as err:
        parse_scenario(base + "timeout_clients_s = 3\n" + groups, path=tmp_path / "s.toml")
    assert "field 'proxy.timeout_clients_s'" in str(err.value) and ":8:" in str(err.value)


def test_missing_binary_fails_at_set_up_with_the_reason(tmp_path, sim):
    for config in (
        NginxProxyConfig(kind="nginx", binary="no-such-nginx"),
        HaproxyProxyConfig(kind="haproxy", binary="no-such-haproxy"),
        EnvoyProxyConfig(kind="envoy", binary="no-such-envoy"),
    ):
        with pytest.raises(TargetError, match="'no-such-.*' is not on PATH \\(.*install"):
            make_proxy(config).start(tmp_path, sim.url)


# --------------------------------------------------------------------------- real processes


@pytest.mark.parametrize(
    "name", [param("nginx-buffered"), param("nginx-sse"), param("haproxy"), param("envoy")]
)
def test_proxy_starts_health_checks_and_stops(tmp_path, sim, name):
    config = proxy_config(name)
    with running_proxy(config, tmp_path, sim.url) as (url, proxy):
        assert url != sim.url
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        models = httpx.get(url + "/v1/models", timeout=5).json()
        assert models["data"][0]["id"] == "sim"
        assert proxy.failure() is None
        info = proxy.describe()
        conf = Path(info["config_file"])
        assert conf.parent == (tmp_path / config.kind).resolve() and conf.read_text()
        assert info["argv"][0].endswith(config.kind)
        pid = proxy.server.proc.pid  # type: ignore[attr-defined]
    # stopped with the run: the process group is gone and the port is free again
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)
    with pytest.raises(httpx.TransportError):
        httpx.get(url + "/health", timeout=2)
    assert proxy.failure() is not None


@needs("nginx")
def test_a_proxy_that_cannot_start_names_itself_and_quotes_its_log(tmp_path, sim):
    # a port that is taken: nginx cannot bind and says so in its error log
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = NginxProxyConfig(kind="nginx", listen_port=port, startup_timeout_s=5)
        with pytest.raises(TargetError, match="nginx.*(in use|bind)"):
            make_proxy(config).start(tmp_path, sim.url)


# --------------------------------------------------------------------------- traefik, chain


def test_traefik_options_become_its_own_settings(tmp_path):
    from harness.servers._traefik import TraefikProxyConfig, traefik_configs

    config = TraefikProxyConfig(
        compress=True, min_response_body_bytes=4096, excluded_content_types=["text/event-stream"],
        buffering=True, flush_interval_ms=-1, write_timeout_s=2.5,
    )  # fmt: skip
    static, dynamic = traefik_configs(
        config, port=8081, metrics_port=8082, upstream_url="http://127.0.0.1:9", folder=tmp_path
    )
    web = static["entryPoints"]["web"]
    assert web["address"] == "127.0.0.1:8081"
    # its own metrics on an entry point of their own, never routed to the target
    assert static["entryPoints"]["metrics"] == {"address": "127.0.0.1:8082"}
    assert static["metrics"]["prometheus"]["entryPoint"] == "metrics"
    assert web["transport"]["respondingTimeouts"]["writeTimeout"] == "2500ms"
    http = dynamic["http"]
    assert http["routers"]["target"]["middlewares"] == ["compress", "buffering"]
    assert http["middlewares"]["compress"]["compress"] == {
        "minResponseBodyBytes": 4096, "excludedContentTypes": ["text/event-stream"],
    }  # fmt: skip
    service = http["services"]["target"]["loadBalancer"]
    assert service["servers"] == [{"url": "http://127.0.0.1:9"}]
    assert service["responseForwarding"]["flushInterval"] == "-1ms"
    plain = traefik_configs(
        TraefikProxyConfig(), port=1, metrics_port=2, upstream_url="u", folder=tmp_path
    )[1]
    assert (
        "middlewares" not in plain["http"]
        and "middlewares" not in plain["http"]["routers"]["target"]
    )


def test_a_chain_needs_two_real_hops():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="at least 2"):
        PROXIES.get("chain")(hops=[{"kind": "egress"}])
    with pytest.raises(ValidationError, match="hop 1: kind 'none' cannot be a hop"):
        PROXIES.get("chain")(hops=[{"kind": "egress"}, {"kind": "none"}])


def test_litellm_options_become_its_config():
    from harness.servers._litellm import LitellmProxyConfig, litellm_config

    data = litellm_config(
        LitellmProxyConfig(cancel_on_disconnect=True, stream_timeout_s=30),
        upstream_url="http://127.0.0.1:9",
    )
    (entry,) = data["model_list"]
    assert entry["model_name"] == "*" and entry["litellm_params"]["model"] == "hosted_vllm/*"
    assert entry["litellm_params"]["api_base"] == "http://127.0.0.1:9/v1"
    assert entry["litellm_params"]["stream_timeout"] == 30
    assert data["general_settings"]["cancel_on_disconnect"] is True
    shipped = litellm_config(LitellmProxyConfig(), upstream_url="http://127.0.0.1:9")
    assert "cancel_on_disconnect" not in shipped["general_settings"]  # the version's default
    # its own metrics, unless asked not to (a LiteLLM without prometheus-client)
    settings = shipped["litellm_settings"]
    assert settings["callbacks"] == ["prometheus"]
    assert settings["require_auth_for_metrics_endpoint"] is False
    quiet = litellm_config(LitellmProxyConfig(prometheus=False), upstream_url="http://h:9")
    assert "callbacks" not in quiet["litellm_settings"]
