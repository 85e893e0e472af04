"""report.html from real engine-emulator runs, opened in headless Chromium: the plots drew,
the page logged no error and asked the network for nothing."""

from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest
from markupsafe import escape

from harness.lifecycle import RunResult
from harness.outputs._report import (
    REPORT_NAME,
    ReportError,
    render_report,
    report_or_warning,
    write_report,
)
from harness.outputs._report._data import events, itl_ms, load_run, ttft_ms
from tests._chromium import needs_chromium
from tests._sim_runs import rst_run, sim_runs
from tests.conftest import REPO, ZEROWINDOW


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return sim_runs(tmp_path_factory)


def test_run_writes_the_report(runs):
    for name, result in runs.items():
        assert result.exit_code == 0, (name, result.summary.failure)
        html = (result.run_dir / REPORT_NAME).read_text()
        assert len(html) > 1_000_000  # plotly.js inlined
        assert "kv held by undelivered streams" in html
        assert "s group slow starts" in html and "s group fast starts" in html  # phase list
        assert result.summary.verdicts["kv_held_by_undelivered_streams"]["line"] in html


@needs_chromium
def test_chromium_check_sees_errors_and_network_use(tmp_path):
    """The page check can fail: a console error, an exception and a request are caught."""
    from tests._chromium import open_page

    page = tmp_path / "bad.html"
    page.write_text(
        "<html><body><script>console.error('boom'); fetch('http://127.0.0.1:9/x');"
        "undefinedFunction();</script></body></html>"
    )
    result = open_page(page.as_uri(), "document.body.childElementCount", settle_s=0.5)
    assert any("boom" in e for e in result.console_errors), result.console_errors
    assert any("undefinedFunction" in e for e in result.console_errors), result.console_errors
    assert result.external_requests == ["http://127.0.0.1:9/x"]
    assert result.value == 1


def test_report_data_has_the_markers(runs):
    data = load_run(runs["on_delivery"].run_dir)
    kinds = {e.kind for e in events(data)}
    # 4 slow readers stop reading (stall onsets) and abort; both groups start (phases).
    assert kinds >= {"phase", "stall", "abort"}, kinds
    assert sum(e.kind == "stall" for e in events(data)) == 4
    assert all(0 <= e.s <= data.summary["duration_s"] + 1 for e in events(data))


def test_rst_and_group_starts_are_marked(tmp_path_factory):
    result = rst_run(tmp_path_factory)
    assert result.exit_code == 1, result.summary.failure  # a gate failed, on purpose
    data = load_run(result.run_dir)
    evs = events(data)
    rsts = [e for e in evs if e.kind == "cut"]
    assert [e.text for e in rsts] == ["rst: client sent RST"] * 2, evs
    starts = {e.text: e.s for e in evs if e.kind == "phase" and "starts" in e.text}
    # rst has start_after_s = 3; each load process's own start-up (Locust, ~1 s, noisy on a
    # busy 2-core machine) blurs the gap.
    assert 1 < starts["group rst starts"] - starts["group fast starts"] < 6, starts
    first = data.requests.groupby("group")["t_send"].min() - data.t0
    assert starts["group rst starts"] == pytest.approx(first["rst"])
    assert "client sent RST" in (result.run_dir / REPORT_NAME).read_text()


@needs_chromium
def test_report_opens_in_chromium_with_plots_drawn(runs, tmp_path):
    from tests._chromium import PLOT_CHECK, open_page

    report = runs["on_delivery"].run_dir / REPORT_NAME
    page = open_page(report.resolve().as_uri(), PLOT_CHECK)
    (tmp_path / "report.png").write_bytes(page.screenshot)  # kept for a look
    assert page.console_errors == []
    assert page.external_requests == []
    plots = page.value
    assert set(plots) == {"swimlane", "timeline", "ttft-cdf", "itl-cdf"}, plots
    for name, plot in plots.items():
        assert plot["width"] > 300 and plot["height"] > 200, (name, plot)
    timeline = plots["timeline"]
    # events, KV, requests, preemptions/s, tokens/s, Send-Q and the kernel's rwnd-limited time
    # (inet_diag): every row drew something.
    assert len(timeline["subplots"]) == 7, timeline
    assert "Send-Q (bytes), slowest connections" in timeline["titles"]
    assert "rwnd_limited_ms, slowest connections" in timeline["titles"]
    events_row = timeline["subplots"]["xy"]
    assert events_row["points"] >= 4 + 4 + 2, events_row  # stalls, aborts, group starts
    for name, sp in timeline["subplots"].items():
        if name != "xy":
            assert sp["lines"] >= 1, (name, sp)
    # One CDF line per user class.
    assert plots["ttft-cdf"]["subplots"]["xy"]["lines"] == 2
    assert plots["itl-cdf"]["subplots"]["xy"]["lines"] == 2
    assert len(page.screenshot) > 50_000


def test_report_without_socket_samples_or_run_json(runs, tmp_path):
    """A run folder with no socket samples and no run.json still renders (no Send-Q row)."""
    src = runs["on_finish"].run_dir
    for name in ("summary.json", "requests.parquet", "chunks.parquet", "server_metrics.parquet"):
        shutil.copyfile(src / name, tmp_path / name)
    empty = pd.read_parquet(src / "sockets.parquet").iloc[0:0]
    empty.to_parquet(tmp_path / "sockets.parquet")
    html = render_report(tmp_path)
    assert "Send-Q (bytes), slowest connections" not in html
    assert "KV cache usage" in html


def test_rwnd_limited_column_gets_its_own_row(runs, tmp_path):
    src = runs["on_delivery"].run_dir
    for path in src.iterdir():
        if path.is_file():
            shutil.copyfile(path, tmp_path / path.name)
    sockets = pd.read_parquet(src / "sockets.parquet")
    sockets["rwnd_limited_ms"] = (sockets["send_q_bytes"] > 0).astype(float) * 100.0
    sockets.to_parquet(tmp_path / "sockets.parquet")
    assert "rwnd_limited_ms, slowest connections" in render_report(tmp_path)


def test_unreadable_run_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ReportError, match="summary.json: missing"):
        write_report(tmp_path)
    (tmp_path / "summary.json").write_text("{not json")
    with pytest.raises(ReportError, match="summary.json: cannot read"):
        write_report(tmp_path)


def test_report_cli(runs, tmp_path):
    out = tmp_path / "r.html"
    run_dir = runs["on_finish"].run_dir
    done = subprocess.run(
        [*ZEROWINDOW, "report", str(run_dir), "--out", str(out)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert str(out) in done.stdout and out.stat().st_size > 1_000_000
    bad = subprocess.run(
        [*ZEROWINDOW, "report", str(tmp_path / "nowhere")],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert bad.returncode == 2 and "not a folder" in bad.stderr, bad.stderr
    assert "Traceback" not in bad.stderr


def test_report_failure_is_a_warning_not_an_error(tmp_path):
    (tmp_path / "summary.json").write_text("[]")
    warning = report_or_warning(tmp_path)
    assert warning is not None and "report.html not written" in warning
    assert "expected a JSON object" in warning


def test_report_distributions_match_the_summary(runs):
    """The CDFs plot the same values the summary's percentiles come from."""
    result = runs["on_delivery"]
    data = load_run(result.run_dir)
    for g in result.summary.groups:
        assert np.percentile(ttft_ms(data, g.group), 90) == pytest.approx(g.ttft_p90_ms)
        assert np.percentile(itl_ms(data, g.group), 50) == pytest.approx(g.itl_p50_ms)
        assert np.percentile(itl_ms(data, g.group), 99) == pytest.approx(g.itl_p99_ms)


def test_unknown_verdicts_and_summary_keys_are_rendered_generically(runs, tmp_path):
    """Verdicts and summary sections added later (nested numbers, lists) still show up."""
    src = runs["on_finish"].run_dir
    for path in src.iterdir():
        if path.is_file():
            shutil.copyfile(path, tmp_path / path.name)
    summary = json.loads((src / "summary.json").read_text())
    summary["verdicts"]["wasted_decode_after_stall"] = {
        "status": "held", "line": "wasted decode: 123 tokens", "per_group": {"slow": 123.5},
    }  # fmt: skip
    summary["gates"] = [{"figure": "fast.ttft_p99_ms", "bound": 800, "passed": False}]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    html = render_report(tmp_path)
    assert "wasted decode after stall" in html and "wasted decode: 123 tokens" in html
    assert "per_group.slow" in html and "123.5" in html
    assert "<h3>gates</h3>" in html and "fast.ttft_p99_ms" in html


def test_gates_are_reported_with_their_numbers(tmp_path_factory):
    """A run whose gate failed still gets its report, with the gates and the exit code."""
    result = rst_run(tmp_path_factory)
    html = (result.run_dir / REPORT_NAME).read_text()
    assert "<h2>Gates</h2>" in html and "1 failed, 0 skipped, of 2" in html
    assert "exit code 1" in html
    failed = next(g for g in result.gates if not g.passed)
    assert failed.figure == "rst.ttft_p50_ms" and str(escape(failed.reason)) in html


def test_run_that_measured_nothing_still_renders(runs, tmp_path):
    """A run whose target never came up: empty tables, a page that says so."""
    src = runs["on_finish"].run_dir
    shutil.copyfile(src / "run.json", tmp_path / "run.json")
    summary = json.loads((src / "summary.json").read_text())
    summary.update(status="failed", failure="target did not start", groups=[])
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    for name in ("requests", "chunks", "server_metrics", "sockets"):
        pd.read_parquet(src / f"{name}.parquet").iloc[0:0].to_parquet(tmp_path / f"{name}.parquet")
    html = render_report(tmp_path)
    assert "nothing was measured" in html and "no request got a first token" in html
    assert "target did not start" in html
