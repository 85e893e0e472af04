"""The two llama.cpp engines end to end, through the CLI, with their shipped scenarios: a real
llama-cpp-python server (positive control: HELD, victims wait for the stall) and a real
llama-server (negative control: none held; threads and memory grow), each with its control arm,
in the run's own network namespaces with the server's send buffers capped.

`make test` builds both engines first (`make engines`); run alone, these tests skip with the
reason when an engine or the tiny GGUF model is missing. Each run takes about 15 s (a 7 s
stall, the control arm, start and stop)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import REPO, only_run_dir, run_cli
from tests.netem_fixtures import skip_without_net_admin

SCENARIOS = REPO / "scenarios"


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny GGUF model `make engines` wrote, or one made now from the tiny HF model."""
    made = REPO / "models" / "tiny" / "tiny.gguf"
    if made.exists():
        return made
    from harness.servers._tiny_gguf import write_gguf
    from harness.servers._tiny_model import make_tiny_model

    folder = make_tiny_model(tmp_path_factory.mktemp("model") / "tiny", seed=0)
    return write_gguf(folder, folder / "tiny.gguf")


# The stalls held as long as each behaviour needs (the shipped scenarios hold 12 s): the
# victims of llama-cpp-python's held lock arrive 3 s in, not 5, and wait ~5 s instead of 7.
SHORTER = {"hold_s = 12": "hold_s = 7", "start_after_s = 5": "start_after_s = 3"}


def _scenario(name: str, model: Path, tmp_path: Path) -> Path:
    """The shipped scenario ``name`` with its model path pointed at ``model`` and its stall
    shortened (:data:`SHORTER`)."""
    text = (SCENARIOS / f"{name}.toml").read_text()
    text = text.replace('model = "models/tiny/tiny.gguf"', f'model = "{model}"')
    assert "hold_s = 12" in text, name
    for old, new in SHORTER.items():
        text = text.replace(old, new)
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def _run(name: str, model: Path, tmp_path: Path) -> tuple[Path, dict, str]:
    """Run the scenario; return its first repeat's folder, summary and the CLI's output."""
    skip_without_net_admin()
    res = run_cli(
        "run", str(_scenario(name, model, tmp_path)), "--out", str(tmp_path / "out"),
        "--no-progress", timeout=300,
    )  # fmt: skip
    output = res.stdout[-6000:] + res.stderr[-3000:]
    assert res.returncode == 0, output
    run_dir = only_run_dir(tmp_path / "out")
    summary = json.loads((run_dir / "r1" / "summary.json").read_text())
    return run_dir, summary, res.stdout


def _group(summary: dict, name: str) -> dict:
    return next(g for g in summary["groups"] if g["group"] == name)


@pytest.fixture(scope="module")
def llama_cpp_python() -> None:
    pytest.importorskip("llama_cpp.server", reason="llama-cpp-python[server] (make engines)")


@pytest.fixture(scope="module")
def llama_server() -> None:
    from harness.servers._llama_build import find_llama_server

    if find_llama_server() is None:
        pytest.skip("no llama-server binary (make engines builds it)")


@pytest.mark.usefixtures("llama_cpp_python")
def test_llama_cpp_python_holds_the_engine_for_a_stalled_reader(gguf: Path, tmp_path: Path):
    run_dir, summary, out = _run("llamacpp-python-stall", gguf, tmp_path)
    verdict = summary["verdicts"]["kv_held_by_undelivered_streams"]
    assert verdict["status"] == "held", verdict["line"]
    assert verdict["source"] == "engine_probe"
    assert verdict["requests_held_during_generation"] == 1
    assert verdict["victims"] == 2
    # The victims arrive 3 s in and wait for the client that stalled 7 s: about 4 s.
    victims = _group(summary, "victims")
    assert 2500 <= victims["ttft_p50_ms"] <= 7000, victims
    assert victims["outcomes"] == {"complete": 2}
    # The control arm, without the stalled client: the victims are served at once.
    control = json.loads((run_dir / "c1" / "summary.json").read_text())
    assert _group(control, "victims")["ttft_p50_ms"] < 1000
    # The engine's own record: generation paused with the lock held, then aborted at the close.
    engine = pd.read_parquet(run_dir / "r1" / "engine_requests.parquet")
    stalled = engine[engine["output_tokens"] > 32].iloc[0]
    assert stalled["finish_reason"] == "abort"
    assert len(stalled["send_blocked_at"]) >= 1
    pause = stalled["send_unblocked_at"][-1] - stalled["send_blocked_at"][-1]
    assert pause > 3.0
    assert stalled["output_tokens"] < 1500  # paused before its end
    assert "HELD" in out and "queued behind them" in out
    report = (run_dir / "r1" / "report.html").read_text()
    assert "engine kept, generation waiting for delivery" in report


@pytest.mark.usefixtures("llama_cpp_python")
def test_without_the_send_buffer_cap_llama_cpp_python_holds_nothing(gguf: Path, tmp_path: Path):
    _, summary, _ = _run("llamacpp-python-stall-uncapped", gguf, tmp_path)
    verdict = summary["verdicts"]["kv_held_by_undelivered_streams"]
    assert verdict["status"] == "none", verdict["line"]
    assert _group(summary, "victims")["ttft_p99_ms"] < 1000


@pytest.mark.usefixtures("llama_server")
def test_llama_server_frees_its_slots_and_pays_in_threads_and_memory(gguf: Path, tmp_path: Path):
    run_dir, summary, out = _run("llama-server-stall", gguf, tmp_path)
    verdict = summary["verdicts"]["kv_held_by_undelivered_streams"]
    assert verdict["status"] == "none", verdict["line"]
    assert verdict["source"] == "scrapes"  # no probe loads into a C++ server
    assert verdict["undelivered_peak_bytes"] > 100_000
    assert _group(summary, "victims")["ttft_p99_ms"] < 1000
    server = summary["server"]
    assert server["slots_busy_peak"] == 4
    # one HTTP thread per stalled stream (threads_http = 1), undelivered output in memory
    assert server["server_threads_peak"] >= server["server_threads_start"] + 4
    assert server["server_rss_growth_mb"] > 1.0
    costs = summary["verdicts"]["engine_costs"]
    assert costs["threads_peak"] == server["server_threads_peak"]
    assert "engine process: threads" in out
    metrics = pd.read_parquet(run_dir / "r1" / "server_metrics.parquet")
    assert {"slots_busy", "server_threads", "server_rss_bytes"} <= set(metrics.columns)
