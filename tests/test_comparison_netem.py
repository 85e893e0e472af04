"""A proxy comparison with shaped links, in one command: ``zerowindow run
scenarios/sim-proxy-comparison-3g.toml --workers 2`` on the engine emulator (none, nginx
buffering, egress; four slow readers behind 3G, four fast readers unshaped).

The network must be built once and be the same for every configuration, each group's Locust
master and workers must run behind the group's link, the proxies' sockets and buffers must be
seen inside the server's namespace, and the verdicts must tell the configurations apart: the
emulator frees KV only on delivery, so without a proxy the slow readers hold it (HELD), and a
buffering proxy lets the engine go (none held). Needs CAP_NET_ADMIN and nginx.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from netem import has_net_admin
from tests.conftest import REPO, only_run_dir, run_cli

pytestmark = [
    pytest.mark.skipif(not has_net_admin(), reason="needs the CAP_NET_ADMIN capability"),
    pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed"),
]

SCENARIO = REPO / "scenarios" / "sim-proxy-comparison-3g.toml"
CONFIGS = ("none", "nginx-buffered", "egress")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("comparison-3g")
    # The slow readers' answers at 80 tokens (~27 KB) instead of 600: still seconds on 3G
    # and far more than the 4 KiB they let through, in a seventh of the time. The server's send
    # buffers capped at 16 KiB instead of 64 (its namespace's tcp_wmem) so that those answers
    # still outgrow them: the rest waits in the proxy (the egress buffer keeps it in its own
    # with TCP_NOTSENT_LOWAT) or, without one, in the engine.
    scenario = out / SCENARIO.name
    text = SCENARIO.read_text()
    assert text.count("max_tokens = 600") == 1
    assert text.count("cooldown_s = 2\n") == 1
    assert text.count("tcp_wmem = [4096, 16384, 65536]") == 1
    text = text.replace("tcp_wmem = [4096, 16384, 65536]", "tcp_wmem = [4096, 16384, 16384]")
    text = text.replace("cooldown_s = 2\n", "cooldown_s = 0.5\n")  # the clients are gone
    # The 3G link is not measured (10 s at a 300 ms RTT; tests/test_shaping.py measures them);
    # the slow readers' TTFT says it is shaped.
    assert text.count("measure = true\n") == 1
    text = text.replace("measure = true\n", "measure = false\n")
    scenario.write_text(text.replace("max_tokens = 600", "max_tokens = 80"))
    done = run_cli("run", str(scenario), "--out", str(out), "--no-progress", "--workers", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return only_run_dir(out)


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _summary(run_dir: Path, config: str) -> dict[str, Any]:
    return _json(run_dir / config / "summary.json")


def _group(run_dir: Path, config: str, group: str) -> dict[str, Any]:
    return next(g for g in _summary(run_dir, config)["groups"] if g["group"] == group)


def test_one_network_for_every_configuration(run_dir: Path) -> None:
    parent = _json(run_dir / "plan.json")
    assert parent["exit_code"] == 0 and parent["status"] == "complete"
    assert [a["name"] for a in parent["plan"]["arms"]] == list(CONFIGS)
    assert [r["path"] for r in parent["runs"]] == list(CONFIGS)
    network = parent["network"]
    assert network["errors"] == [] and network["shaping"]["slow"]["backend"] in (
        "netem",
        "fallback",
    )
    assert network["shaping"]["slow"]["profile"]["down"]["delay_ms"] == 150
    assert not network["measured"]
    for config in CONFIGS:
        run = _json(run_dir / config / "run.json")
        assert run["status"] == "complete", (config, run.get("failure"))
        # The same namespaces, links and measured figures: built and measured once.
        assert run["network"]["server_netns"] == network["server_netns"]
        assert run["network"]["measured"] == network["measured"]
        assert run["network"]["shaping"] == network["shaping"]
    state = _json(run_dir / "netem-state.json")
    assert state["status"] == "released"
    assert not list(Path("/run/netns").glob(f"zw-{state['run_id']}-*"))
    assert not (run_dir / "none" / "netem-state.json").exists()


def test_masters_and_workers_run_behind_their_links(run_dir: Path) -> None:
    for config in CONFIGS:
        run = _json(run_dir / config / "run.json")
        workers = {p["group"]: [w["name"] for w in p["workers"]] for p in run["load_processes"]}
        assert workers == {"fast": ["w1", "w2"], "slow": ["w1", "w2"]}, config
        assert (run_dir / config / "records-slow@w2.jsonl").exists()
        slow, fast = _group(run_dir, config, "slow"), _group(run_dir, config, "fast")
        assert slow["outcomes"] == {"complete": 4} and fast["outcomes"] == {"complete": 8}
        # A first token needs the handshake and the request: two 300 ms round trips on 3G.
        assert slow["ttft_p50_ms"] > 500, config
        assert fast["ttft_p50_ms"] < 300, config


def test_the_verdicts_tell_the_configurations_apart(run_dir: Path) -> None:
    verdicts = {
        c: _summary(run_dir, c)["verdicts"]["kv_held_by_undelivered_streams"] for c in CONFIGS
    }
    assert verdicts["none"]["status"] == "held" and verdicts["none"]["requests_held"] == 4
    for config in ("nginx-buffered", "egress"):
        assert verdicts[config]["status"] == "none", (config, verdicts[config]["line"])


def test_the_proxies_are_observed_inside_the_server_namespace(run_dir: Path) -> None:
    for config in ("nginx-buffered", "egress"):
        proxy = _summary(run_dir, config)["proxy"]
        # The slow readers' answers (~27 KB each, at most 16 KiB of it in the socket) wait
        # in the proxy: more than the four readers' 4 KiB windows.
        assert proxy["buffered_peak_bytes"] > 4 * 4096, (config, proxy)
        assert proxy["client_send_q_peak_bytes"] > 4096, (config, proxy)
        assert proxy["cuts"] in (None, 0), (config, proxy)


def test_remote_workers_are_refused_before_anything_starts(tmp_path: Path) -> None:
    done = run_cli(
        "run", str(SCENARIO), "--out", str(tmp_path), "--no-progress", "--remote-workers", "1"
    )
    assert done.returncode == 2
    assert "--remote-workers 1 with a plan of several runs" in done.stderr
    assert not any(tmp_path.iterdir())
