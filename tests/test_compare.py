"""zerowindow compare on two real engine-emulator runs: KV released on delivery (stalled
readers hold KV, fast readers wait) against KV released when generation finishes."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess

import pytest

from harness.lifecycle import RunResult
from harness.outputs._compare import compare_runs, html_page, render, rich_table
from harness.outputs._report import ReportError
from tests._chromium import needs_chromium
from tests._sim_runs import sim_runs
from tests.conftest import REPO, ZEROWINDOW


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunResult]:
    return sim_runs(tmp_path_factory)


@pytest.fixture(scope="module")
def dirs(runs):
    return [runs["on_delivery"].run_dir, runs["on_finish"].run_dir]


def test_figures_line_up_with_ratios(dirs, runs):
    c = compare_runs(dirs)
    rows = {r.name: r for r in c.rows}
    held = rows["kv_held_after_finish_s"]
    assert held.values[0] > 1 and held.values[1] == 0 and held.ratios[1] == 0
    ttft = rows["fast.ttft_p90_ms"]
    assert ttft.values == [g.ttft_p90_ms for g in (
        next(g for g in runs[k].summary.groups if g.group == "fast")
        for k in ("on_delivery", "on_finish")
    )]  # fmt: skip
    # Held KV delays the fast readers: on_finish is several times faster at p90.
    assert ttft.ratios[0] == 1.0 and ttft.ratios[1] < 0.5, ttft
    assert rows["fast.outcome.complete"].values == [12.0, 12.0]
    assert c.labels == [d.name for d in dirs]


def test_only_filters_and_rejects_a_pattern_matching_nothing(dirs):
    c = compare_runs(dirs, only=["fast.ttft_*", "server.preemptions"])
    assert [r.name for r in c.rows] == [
        "fast.ttft_p50_ms", "fast.ttft_p90_ms", "fast.ttft_p99_ms", "server.preemptions",
    ]  # fmt: skip
    with pytest.raises(ValueError, match="matches no figure"):
        compare_runs(dirs, only=["nope.*"])


def test_formats(dirs):
    c = compare_runs(dirs, only=["fast.ttft_p90_ms", "kv_seconds"])
    md = render(c, "markdown").splitlines()
    assert md[0] == f"| figure | {dirs[0].name} | {dirs[1].name} | ratio {dirs[1].name} |"
    assert md[2].startswith("| fast.ttft_p90_ms |") and "×" in md[2]
    rows = list(csv.reader(io.StringIO(render(c, "csv"))))
    assert rows[0][0] == "figure" and len(rows) == 3
    assert float(rows[1][3]) == pytest.approx(float(rows[1][2]) / float(rows[1][1]))
    data = json.loads(render(c, "json"))
    assert [r["run_dir"] for r in data["runs"]] == [str(d) for d in dirs]
    assert data["figures"][1]["name"] == "kv_seconds" and data["figures"][1]["values"][1] == 0
    assert rich_table(c).row_count == 2


def test_a_run_that_did_not_complete_is_marked_in_every_format(dirs, tmp_path):
    cut = tmp_path / "cut"
    shutil.copytree(dirs[1], cut)
    summary = json.loads((cut / "summary.json").read_text())
    summary["status"] = "interrupted"
    (cut / "summary.json").write_text(json.dumps(summary))
    c = compare_runs([dirs[0], cut], only=["fast.ttft_p90_ms"])
    md = render(c, "markdown").splitlines()
    assert md[0] == f"| figure | {dirs[0].name} | cut [interrupted] | ratio cut [interrupted] |"
    assert next(csv.reader(io.StringIO(render(c, "csv"))))[2] == "cut [interrupted]"
    assert [col.header for col in rich_table(c).columns][2] == "cut [interrupted]"
    assert json.loads(render(c, "json"))["runs"][1]["status"] == "interrupted"


def test_html_overlays_the_cdfs_of_both_runs(dirs):
    page = html_page(compare_runs(dirs, only=["fast.*"]))
    for div in ("ttft-0", "itl-0", "ttft-1", "itl-1"):  # two user classes
        assert f'id="{div}"' in page
    assert page.count(f"{dirs[1].name} (n=") == 4


@needs_chromium
def test_html_opens_in_chromium(dirs, tmp_path):
    from tests._chromium import PLOT_CHECK, open_page

    path = tmp_path / "compare.html"
    path.write_text(html_page(compare_runs(dirs)))
    page = open_page(path.as_uri(), PLOT_CHECK)
    assert page.console_errors == [] and page.external_requests == []
    assert len(page.value) == 4
    for name, plot in page.value.items():
        assert plot["subplots"]["xy"]["lines"] == 2, (name, plot)  # one line per run


def test_older_summary_is_a_clear_error(dirs, tmp_path):
    summary = json.loads((dirs[0] / "summary.json").read_text())
    del summary["server"]["scrape_gap_max_s"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ReportError, match=r"summary.json: server.scrape_gap_max_s: Field required"):
        compare_runs([dirs[0], tmp_path])


def test_compare_cli(dirs, tmp_path):
    html = tmp_path / "c.html"
    args = [*ZEROWINDOW, "compare", *map(str, dirs)]
    table = subprocess.run(
        [*args, "--only", "kv_*", "--html", str(html)],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert table.returncode == 0, table.stderr
    assert "kv_held_after_finish_s" in table.stdout and "×0.00" in table.stdout
    assert html.stat().st_size > 1_000_000
    md = subprocess.run(
        [*args, "--format", "markdown", "--only", "server.preemptions"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip
    assert md.returncode == 0 and md.stdout.count("\n") == 3, md.stdout
    one = subprocess.run(
        [*ZEROWINDOW, "compare", str(dirs[0])], capture_output=True, text=True, timeout=120
    )
    assert one.returncode == 2 and "two or more" in one.stderr
    bad = subprocess.run([*args, "--format", "yaml"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
