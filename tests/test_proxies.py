"""Proxy kinds: nginx's rendered configuration and the registry."""

from pathlib import Path

import pytest

from harness._proxies import NginxProxyConfig, NoProxyConfig, make_proxy, render_nginx_conf


def test_nginx_conf_carries_the_options():
    config = NginxProxyConfig(
        kind="nginx",
        buffering=False,
        send_timeout_s=3,
        reset_timedout_connection=True,
        buffer_size_kb=8,
        max_temp_file_size_mb=0,
    )
    text = render_nginx_conf(config, prefix=Path("/run/x"), port=8081, upstream="127.0.0.1:9")
    for directive in (
        "listen 127.0.0.1:8081;",
        "server 127.0.0.1:9;",
        "proxy_buffering off;",
        "send_timeout 3000ms;",
        "reset_timedout_connection on;",
        "proxy_buffers 8 8k;",
        "proxy_max_temp_file_size 0m;",
        "pid /run/x/nginx.pid;",
        "proxy_temp_path /run/x/proxy_temp;",
    ):
        assert directive in text, directive
    assert text.count("{") == text.count("}")


def test_registry_builds_by_kind_and_none_passes_the_url_through(tmp_path):
    proxy = make_proxy(NoProxyConfig())
    assert proxy.start(tmp_path, "http://127.0.0.1:9") == "http://127.0.0.1:9"
    with pytest.raises(KeyError, match="valid: \\['egress', 'nginx', 'none'\\]"):
        make_proxy(NoProxyConfig.model_construct(kind="envoy"))  # type: ignore[arg-type]
