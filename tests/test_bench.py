"""`zerowindow bench client` and `zerowindow bench proxy` on tiny workloads: one JSON object
with every figure, the targets and verdicts; a missing tool is a stated reason, a bad input a
one-line error; every process the bench starts is gone after a signal. Behaviour only: the
figures of runs this small are not judged."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.conftest import ZEROWINDOW, run_cli


def _bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ZEROWINDOW, "bench", *args], capture_output=True, text=True, timeout=120, env=env
    )


def test_bench_client_json_has_every_figure_and_verdict():
    result = _bench(
        "client", "--clients", "zerowindow", "--streams", "4", "--events", "200",
        "--paced-events", "100", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    ours = data["clients"]["zerowindow"]
    assert ours["full_speed"]["events"] == 4 * 200
    assert ours["paced"]["events"] == 4 * 100
    assert ours["failed"] == 0
    assert ours["ceiling_events_per_s"] > 0
    for key in ("cpu_us_per_event", "itl_err_p50_ms", "itl_err_p99_ms", "delay_p99_ms"):
        assert key in ours
    assert data["skipped"] == {
        "zerowindow-read": "not asked for (--clients)",
        "vllm": "not asked for (--clients)",
    }
    assert set(data["ratios"]) == {
        "cpu_us_per_event",
        "ceiling_events_per_s",
        "itl_err_p99_ms",
        "paced_cpu_us_per_event",
    }
    assert [v["name"] for v in data["verdicts"]] == ["cpu_per_event", "ceiling", "itl_err_p99"]
    for v in data["verdicts"]:  # vLLM's client was not run: not measured, and why
        assert v["met"] is None and "vllm not measured" in v["reason"]
        assert isinstance(v["threshold"], float)
    assert data["targets_met"] is None
    assert data["machine"]["cpus"] >= 1 and len(data["machine"]["load_avg_before"]) == 3
    assert data["command"].startswith("zerowindow bench client --clients zerowindow --streams 4")
    assert data["offered_events_per_s"] == 800.0


def test_bench_proxy_json_has_every_figure_and_verdict():
    result = _bench(
        "proxy", "--proxies", "none,egress", "--streams", "4", "--duration-s", "1",
        "--repeats", "1", "--flood-events", "200", "--stalled", "4", "--stalled-kib", "16",
        "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert list(data["proxies"]) == ["none", "egress"]
    egress = data["proxies"]["egress"]
    assert egress["events_lost"] == 0
    assert egress["events_per_s"] > 0 and egress["events_per_cpu_s"] > 0
    for key in ("p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "cpu_us_per_event",
                "rss_per_stalled_kib", "stalled_cut"):  # fmt: skip
        assert key in egress
    assert data["proxies"]["none"]["added_p50_ms"] is None  # the baseline
    names = [v["name"] for v in data["verdicts"]]
    assert names == [
        "egress_events_per_cpu_s", "egress_added_p50", "egress_memory_per_stalled_stream"
    ]  # fmt: skip
    for v in data["verdicts"]:
        assert v["met"] is None and "nginx not measured: not in --proxies" in v["reason"]
    assert data["workload"]["streams"] == 4
    assert data["command"].startswith("zerowindow bench proxy --proxies none,egress")


def test_a_proxy_not_installed_is_skipped_with_the_reason(tmp_path):
    # nginx lives in /usr/sbin: without it on PATH the bench says so and goes on
    path = ":".join(p for p in os.environ["PATH"].split(":") if "sbin" not in p)
    result = _bench(
        "proxy", "--proxies", "nginx", "--streams", "2", "--duration-s", "0.2", "--repeats", "1",
        "--flood-events", "10", "--stalled", "1", "--stalled-kib", "4", "--json",
        env={**os.environ, "PATH": path},
    )  # fmt: skip
    if result.returncode == 0 and "nginx" in json.loads(result.stdout)["proxies"]:
        pytest.skip("nginx is on this PATH outside an sbin folder")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert "'nginx' is not on PATH" in data["skipped"]["nginx"]
    assert list(data["proxies"]) == ["none"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["proxy", "--proxies", "none,squid"], "--proxies: unknown squid"),
        (["client", "--clients", "zerowindow,wrk"], "--clients: unknown wrk"),
        (["proxy", "--proxies", ","], "--proxies: give at least one name"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, says):
    result = run_cli("bench", *args)  # in this process: the command refuses before any start
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert "Traceback" not in result.stderr


def test_vllm_missing_is_a_reason(monkeypatch):
    import importlib.util

    from harness.benchmarks import vllm_missing

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert "vLLM is not installed" in (vllm_missing() or "")


def _descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


@pytest.mark.parametrize(
    ("sig", "args"),
    [
        (signal.SIGTERM, ["proxy", "--proxies", "none,egress", "--streams", "4",
                          "--duration-s", "5", "--repeats", "1"]),
        (signal.SIGINT, ["client", "--clients", "zerowindow", "--streams", "4",
                         "--events", "100", "--paced-events", "2000"]),
    ],
)  # fmt: skip
def test_a_signal_stops_every_process_the_bench_started(sig, args):
    proc = subprocess.Popen(
        [*ZEROWINDOW, "bench", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stderr is not None
        last = ""
        # the last progress line: the paced phase of the client, the latency trials of the proxy
        while not (line := proc.stderr.readline()).startswith(
            ("bench: latency", "bench: zerowindow: 4 streams x 2000")
        ):
            assert line, f"the bench ended early: {last}"
            last = line
        time.sleep(1.5)
        children = _descendants(proc.pid)
        assert children, "the bench runs its servers and clients as child processes"
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, [p.cmdline() for p in alive]
    assert sys.modules.get("locust") is None


def test_tables_have_a_cell_under_every_header():
    from harness.benchmarks import ItlResult, Machine, ProxyResult, ProxyWorkload
    from harness.benchmarks._client_check import ClientBench, _figures
    from harness.benchmarks._proxy_bench import ProxyBench, _ratios, _verdicts
    from harness.benchmarks._render import client_cells, markdown_table, proxy_cells

    def itl(client: str, interval_ms: float) -> ItlResult:
        return ItlResult(client, 4, interval_ms, 800.0, 400, 800.0, 0.1, 1.0, 0.2, 2.0, 50.0,
                         10.0, 60.0, 0)  # fmt: skip

    figures = {c: _figures(itl(c, 0), itl(c, 5)) for c in ("zerowindow", "vllm")}
    ratios = {"cpu_us_per_event": 1.0, "ceiling_events_per_s": 1.0, "itl_err_p99_ms": 1.0,
              "paced_cpu_us_per_event": 1.0}  # fmt: skip
    client = ClientBench("cmd", 4, 200, 100, 5.0, 800.0, figures, {}, ratios, [],
                         Machine.now())  # fmt: skip
    proxies = {
        n: ProxyResult(n, 0.3, 1.0, 0.1, 0.2, 1e4, 10.0, 1e5, 0.5, 0.7, 50.0, 0, 0)
        for n in ("none", "egress", "nginx")
    }
    verdicts = _verdicts(proxies, {})
    assert [v.met for v in verdicts] == [True, True, True]
    proxy = ProxyBench("cmd", ProxyWorkload(), proxies, {}, _ratios(proxies), verdicts,
                       Machine.now())  # fmt: skip
    for headers, rows in (client_cells(client), proxy_cells(proxy)):
        assert rows and all(len(row) == len(headers) for row in rows)
    lines = markdown_table(client_cells(client))
    assert len(lines) == 2 + 3 and lines[-1].startswith("| ours / vLLM |")


def test_every_exported_name_resolves():
    import harness.benchmarks

    assert all(getattr(harness.benchmarks, n, None) is not None for n in harness.benchmarks.__all__)


def test_bench_reader_counts_events_whose_blank_line_a_proxy_split() -> None:
    from harness.benchmarks._upstream import StreamReader

    events = b"".join(b'data: {"t":%d}\n\n' % i for i in range(50))
    # re-chunked at every size from 1 to 40 bytes, so some chunks end between the two LFs
    for size in range(1, 41):
        parts = [events[i : i + size] for i in range(0, len(events), size)]
        body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        wire = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + body
        reader = StreamReader(stamps=True)
        for i in range(0, len(wire), 7):
            reader.feed(wire[i : i + 7], now_ns=1000)
        assert (reader.status, reader.done, reader.events) == (200, True, 50), size
        assert len(reader.latencies) == 50
