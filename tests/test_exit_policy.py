"""One exit-code policy for every command (``harness.lifecycle._exit``), and what makes a run
failed whatever its kind of failure (``harness.analysis.all_requests_failed``)."""

from __future__ import annotations

import pandas as pd
import pytest

from harness.analysis import all_requests_failed
from harness.gates import GateResult
from harness.lifecycle import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_SETUP, decide


def _gate(passed: bool) -> GateResult:
    return GateResult("g", "f", "<=", False, 1.0, None, 2.0, passed, "r")


def test_the_policy_in_order_of_precedence() -> None:
    assert decide(["complete"], [_gate(True)]) == EXIT_OK
    assert decide(["complete"], [_gate(False)]) == EXIT_FAILED
    assert decide(["complete", "failed"], [_gate(True)]) == EXIT_FAILED
    assert decide(["complete"], setup_failed=True) == EXIT_SETUP
    assert decide(["complete", "interrupted"], [_gate(False)]) == EXIT_INTERRUPTED
    assert decide([], interrupted=True, setup_failed=True) == EXIT_INTERRUPTED
    assert decide([]) == EXIT_OK  # nothing ran, nothing failed (a plan refuses before that)


def _requests(*outcomes: str) -> pd.DataFrame:
    return pd.DataFrame({"outcome": list(outcomes), "error": ["boom"] * len(outcomes)})


@pytest.mark.parametrize("outcome", ["http_error", "not_sse", "server_error_event"])
def test_a_run_in_which_every_request_failed_is_failed_whatever_the_failure(outcome: str) -> None:
    why = all_requests_failed(_requests(outcome, outcome))
    assert why is not None and f"{outcome} 2" in why and "boom" in why


def test_mixed_failures_fail_too_but_not_one_success_or_a_clients_own_leaving() -> None:
    assert all_requests_failed(_requests("http_error", "not_sse")) is not None
    assert all_requests_failed(_requests("http_error", "complete")) is None
    assert all_requests_failed(_requests("client_abort", "client_abort")) is None
    assert all_requests_failed(_requests("cut_by_peer")) is None  # a proxy's cut, asked for
    assert all_requests_failed(_requests()) is None
