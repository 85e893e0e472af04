"""The exit code of every command that runs or analyses something: one policy, decided here.

``zerowindow run``, ``sweep``, ``analyze``, ``suite run``, ``bench gates``, the pytest plugin
and the Python API all take their exit code from :func:`decide` (docs/ci.md):

- 130: stopped by SIGINT or SIGTERM (what was measured is kept);
- 2: nothing could be measured: the target, a proxy or the network did not start (an invalid
  scenario or argument never gets this far: the command refuses it with 2 before);
- 1: a run failed while it measured (the engine died, every request failed: see
  ``harness.analysis.all_requests_failed``), or a gate failed;
- 0: every run completed and every gate passed. A run folder whose harness was killed
  (status ``killed``, found by ``zerowindow analyze``) is judged by its gates on what it
  recorded: the kill is the run's end, not a failure of the stack.
"""

from __future__ import annotations

from collections.abc import Iterable

from harness.gates import GateResult

EXIT_OK, EXIT_FAILED, EXIT_SETUP, EXIT_INTERRUPTED = 0, 1, 2, 130


def decide(
    statuses: Iterable[str],
    gates: Iterable[GateResult] = (),
    *,
    setup_failed: bool = False,
    interrupted: bool = False,
) -> int:
    """The exit code (module docstring) of runs with ``statuses`` (``complete``, ``failed``,
    ``interrupted``, ``killed``) and ``gates``; ``setup_failed``: nothing was measured
    because the stack did not start; ``interrupted``: a signal stopped the command (also when
    a status says so)."""
    statuses = list(statuses)
    if interrupted or "interrupted" in statuses:
        return EXIT_INTERRUPTED
    if setup_failed:
        return EXIT_SETUP
    if any(s not in ("complete", "killed") for s in statuses) or not all(g.passed for g in gates):
        return EXIT_FAILED
    return EXIT_OK


def exit_code(status: str, *, setup_failed: bool, gates: Iterable[GateResult]) -> int:
    """The exit code of one run: :func:`decide` with its status; ``setup_failed`` counts only
    for a run that did not complete."""
    return decide([status], gates, setup_failed=setup_failed and status != "complete")
