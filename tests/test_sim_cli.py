"""``python -m harness._sim`` as a real process: starts, serves, stops cleanly on SIGTERM."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

from harness._sim.__main__ import build_parser
from tests.test_sim_helpers import CLIENT, scrape, stalled_client, wait_for


def test_parser_covers_every_config_field() -> None:
    args = vars(
        build_parser().parse_args(
            ["--port", "0", "--kv-release", "on_delivery", "--num-blocks", "8",
             "--step-fixed-ms", "1.5", "--sndbuf-bytes", "4096"]
        )
    )  # fmt: skip
    assert args["kv_release"] == "on_delivery" and args["num_blocks"] == 8
    assert args["step_fixed_ms"] == 1.5 and args["sndbuf_bytes"] == 4096
    assert "block_size" not in args  # unset options keep SimConfig's defaults


def test_serves_and_exits_zero_on_sigterm_with_a_stalled_client() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness._sim", "--port", "0", "--kv-release", "on_delivery",
         "--step-fixed-ms", "0.2", "--num-blocks", "128"],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        port = None
        deadline = time.monotonic() + 30
        lines = []
        while port is None and time.monotonic() < deadline:
            line = proc.stderr.readline()
            lines.append(line)
            found = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if found:
                port = int(found.group(1))
        assert port is not None, "".join(lines)
        url = f"http://127.0.0.1:{port}"
        assert CLIENT.get(url + "/health").status_code == 200
        client = stalled_client(port, max_tokens=1000)
        wait_for(
            lambda: scrape(url)["sim:num_requests_held_for_delivery"] == 1,
            timeout_s=20,
            what="the stalled request to be held",
        )
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - started < 10  # graceful timeout is 2 s
        rest = proc.stderr.read()
        assert "Exception in ASGI application" not in rest, rest
        client.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
