"""Gates: a scenario's pass/fail conditions evaluated against a run's figures, and the
baselines relative gates compare with."""

from harness.gates._baseline import (
    BASELINE_DIR,
    Baseline,
    BaselineError,
    baseline_path,
    load_baseline,
    read_summary,
    save_baseline,
)
from harness.gates._evaluate import (
    FAIL,
    INCONCLUSIVE,
    PASS,
    SKIPPED,
    GateResult,
    evaluate_gates,
    wants_rerun,
)

__all__ = [
    "FAIL",
    "INCONCLUSIVE",
    "PASS",
    "SKIPPED",
    "BASELINE_DIR",
    "Baseline",
    "BaselineError",
    "GateResult",
    "baseline_path",
    "evaluate_gates",
    "load_baseline",
    "read_summary",
    "save_baseline",
    "wants_rerun",
]
