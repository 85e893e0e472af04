"""Percentile math and per-token ITL from multi-token chunks."""

import math

import numpy as np
import pytest

from harness.analysis._latency import inter_chunk, per_token_itl, percentile, tpot


def test_percentile_matches_linear_interpolation():
    values = [10.0, 20.0, 30.0, 40.0]
    assert percentile(values, 50) == pytest.approx(25.0)
    assert percentile(values, 0) == 10.0
    assert percentile(values, 100) == 40.0
    # rank (n-1)*0.9 = 2.7 -> 30 + 0.7 * 10
    assert percentile(values, 90) == pytest.approx(37.0)


def test_percentile_of_nothing_is_none_and_nans_are_ignored():
    assert percentile([], 50) is None
    assert percentile([math.nan, math.nan], 99) is None
    assert percentile([1.0, math.nan, 3.0], 50) == pytest.approx(2.0)


def test_percentile_rejects_q_outside_range():
    with pytest.raises(ValueError, match="0..100"):
        percentile([1.0], 101)


def test_p99_of_uniform_sample():
    values = np.arange(1, 101, dtype=float)  # 1..100
    assert percentile(values, 99) == pytest.approx(99.01)


def test_multi_token_chunk_contributes_k_gaps():
    # chunk 0 at t=1.0 (1 token), chunk 1 at 1.1 (1 token), chunk 2 at 1.4 carrying 3 tokens
    itl = per_token_itl([1.0, 1.1, 1.4], [1, 1, 3])
    assert itl == pytest.approx([0.1, 0.1, 0.1, 0.1])
    assert len(itl) == 4  # 1 + 3 tokens after the first chunk


def test_first_chunk_gives_no_itl_and_mismatch_raises():
    assert per_token_itl([2.0], [5]) == []
    with pytest.raises(ValueError):
        per_token_itl([1.0, 2.0], [1])
    with pytest.raises(ValueError, match="token-less"):
        per_token_itl([1.0, 2.0], [1, 0])


def test_inter_chunk_and_tpot():
    assert inter_chunk([1.0, 1.1, 1.4]) == pytest.approx([0.1, 0.3])
    assert tpot(1.0, 1.4, 5) == pytest.approx(0.1)
    assert tpot(1.0, 1.0, 1) is None
