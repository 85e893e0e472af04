"""Analysis: a pure function of a run folder. One implementation of each latency definition
(TTFT, per-token ITL, inter-chunk latency, TPOT), the per-request tables, the summary, the
verdicts, stalled streams, client saturation and the proxy comparison."""

from harness.analysis._analyze import (
    Analysis,
    RunFacts,
    all_requests_failed,
    analyze,
    read_facts,
    write_analysis,
)
from harness.analysis._comparison import (
    Comparison,
    DistortionThresholds,
    buffering_distortion,
    compare,
)
from harness.analysis._latency import (
    inter_chunk,
    inter_chunk_s,
    per_token_itl,
    per_token_itl_s,
    percentile,
    token_gaps,
    tpot,
)
from harness.analysis._saturation import saturation_summary
from harness.analysis._uncertainty import (
    Difference,
    Estimate,
    Evidence,
    compare_figure,
    draws,
    empty_samples,
    estimate,
    evidence_of,
    impact,
    interval,
    median_ratio,
    p_value,
    point,
    pooled_figures,
    ratio_draws,
    run_samples,
)
from harness.analysis._verdicts import KvHeldVerdict, kv_held_verdict

__all__ = [
    "Analysis",
    "Difference",
    "Estimate",
    "Evidence",
    "Comparison",
    "DistortionThresholds",
    "KvHeldVerdict",
    "RunFacts",
    "all_requests_failed",
    "analyze",
    "buffering_distortion",
    "compare",
    "compare_figure",
    "draws",
    "empty_samples",
    "estimate",
    "evidence_of",
    "impact",
    "interval",
    "median_ratio",
    "p_value",
    "point",
    "pooled_figures",
    "ratio_draws",
    "run_samples",
    "inter_chunk",
    "inter_chunk_s",
    "kv_held_verdict",
    "per_token_itl",
    "per_token_itl_s",
    "percentile",
    "read_facts",
    "saturation_summary",
    "token_gaps",
    "tpot",
    "write_analysis",
]
