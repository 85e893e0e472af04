"""Length distributions of prompt and output tokens (``loadgen._lengths``): each kind draws
what it says, a seed repeats its draws, and a bad table gets an error at its field."""

from __future__ import annotations

import random

import numpy as np
import pytest
from pydantic import ValidationError

from loadgen import LENGTHS, UserGroupConfig
from loadgen._lengths import draw_tokens


def _draws(n: int = 20000, seed: int = 0, **fields: object) -> np.ndarray:
    dist = LENGTHS.parse(fields)
    rng = random.Random(seed)
    return np.array([dist.draw(rng) for _ in range(n)])


def test_each_kind_draws_what_it_says():
    assert set(_draws(100, kind="fixed", value=7)) == {7}
    uniform = _draws(kind="uniform", min=3, max=9)
    assert set(uniform) == set(range(3, 10))
    normal = _draws(kind="normal", mean=100, stdev=20, min=60, max=130)
    assert normal.min() == 60 and normal.max() == 130  # clamped at both ends
    assert np.median(normal) == pytest.approx(100, abs=2)
    lognormal = _draws(kind="lognormal", mean=200, stdev=150)
    assert lognormal.mean() == pytest.approx(200, rel=0.05)
    assert lognormal.std() == pytest.approx(150, rel=0.1)
    assert np.median(lognormal) < lognormal.mean()  # the long tail
    assert lognormal.min() >= 1


def test_a_seed_repeats_its_draws():
    a = _draws(50, seed=4, kind="lognormal", mean=64, stdev=32)
    assert list(a) == list(_draws(50, seed=4, kind="lognormal", mean=64, stdev=32))
    assert list(a) != list(_draws(50, seed=5, kind="lognormal", mean=64, stdev=32))
    assert draw_tokens(12, random.Random(0)) == 12


def test_groups_take_a_number_or_a_distribution():
    base = {"name": "g", "users": 1, "requests_per_user": 1}
    group = UserGroupConfig(**base, prompt_tokens={"kind": "uniform", "min": 4, "max": 8})
    assert group.prompt_tokens.kind == "uniform"  # type: ignore[union-attr]
    dumped = group.model_dump(mode="json")
    assert dumped["prompt_tokens"] == {"kind": "uniform", "min": 4, "max": 8}
    assert dumped["max_tokens"] == 128
    assert UserGroupConfig.model_validate(dumped) == group
    for bad, message in (
        (0, "at least 1"),
        (True, "whole number of tokens"),
        ({"kind": "normal", "mean": 10}, "stdev"),
        ({"kind": "uniform", "min": 9, "max": 3}, "max=3 is below min=9"),
        ({"kind": "zipf"}, "valid kinds: fixed, lognormal, normal, uniform"),
    ):
        with pytest.raises(ValidationError, match=message):
            UserGroupConfig(**base, max_tokens=bad)
