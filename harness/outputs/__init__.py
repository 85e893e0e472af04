"""Outputs: what people and CI systems read of a run: the console tables, ``junit.xml``, the
GitHub step summary, the HTML report, ``zerowindow compare``, the proxy comparison, the
sweep and the incident suite."""

from harness.outputs._compare import FORMATS, compare_runs, html_page, render, rich_table
from harness.outputs._comparison import print_comparison, to_markdown, write_comparison
from harness.outputs._console import print_gates, print_hops, print_summary
from harness.outputs._history import (
    HISTORY_HTML,
    history_markdown,
    print_history,
    write_history_page,
)
from harness.outputs._junit import JunitSuite, junit_run, junit_xml, write_junit
from harness.outputs._matrix import abort_text, ratio_text, wasted_text
from harness.outputs._otlp_send import send_traces, traces_endpoint
from harness.outputs._repeats import print_repeats, repeats_markdown
from harness.outputs._report import ReportError, render_report, report_or_warning, write_report
from harness.outputs._step_summary import (
    ENV as STEP_SUMMARY_ENV,
)
from harness.outputs._step_summary import (
    append_markdown,
    append_setup_error,
    append_step_summary,
    step_summary_markdown,
)
from harness.outputs._suite import (
    CaseOutcome,
    SuiteResult,
    case_record,
    print_suite,
    suite_junit,
    write_suite_junit,
)
from harness.outputs._sweep import print_sweep, write_sweep
from harness.outputs._writers import OUTPUTS, Concluded, FolderOutput, write_outputs

__all__ = [
    "send_traces",
    "traces_endpoint",
    "HISTORY_HTML",
    "history_markdown",
    "print_history",
    "write_history_page",
    "case_record",
    "write_outputs",
    "FolderOutput",
    "Concluded",
    "OUTPUTS",
    "wasted_text",
    "ratio_text",
    "abort_text",
    "rich_table",
    "FORMATS",
    "JunitSuite",
    "junit_run",
    "STEP_SUMMARY_ENV",
    "CaseOutcome",
    "ReportError",
    "SuiteResult",
    "append_markdown",
    "append_setup_error",
    "append_step_summary",
    "compare_runs",
    "html_page",
    "junit_xml",
    "print_comparison",
    "print_gates",
    "print_hops",
    "print_repeats",
    "print_summary",
    "print_suite",
    "print_sweep",
    "render",
    "repeats_markdown",
    "render_report",
    "report_or_warning",
    "step_summary_markdown",
    "suite_junit",
    "to_markdown",
    "write_comparison",
    "write_junit",
    "write_report",
    "write_suite_junit",
    "write_sweep",
]
