"""Open-loop arrival schedules (``loadgen._arrivals``): what each kind draws, that a seed
reproduces a schedule exactly, how ramps and bounds shape it, how it is shared among load
processes, and the errors a group's configuration gets."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from scipy import stats

from loadgen import ARRIVALS, UserGroupConfig
from loadgen._arrivals import share


def _schedule(seed: int = 0, **fields: object) -> list[float]:
    return ARRIVALS.parse(fields).schedule(seed)


def test_a_seed_reproduces_a_schedule_exactly_and_another_seed_does_not():
    a = _schedule(7, kind="poisson", rate_rps=50, requests=500)
    assert a == _schedule(7, kind="poisson", rate_rps=50, requests=500)
    assert a != _schedule(8, kind="poisson", rate_rps=50, requests=500)
    assert a[0] == 0.0 and len(a) == 500 and a == sorted(a)


def test_poisson_gaps_are_exponential_at_the_rate():
    gaps = np.diff(_schedule(1, kind="poisson", rate_rps=20, requests=2000))
    assert stats.kstest(gaps, "expon", args=(0, 1 / 20)).pvalue > 0.01
    # ...and not at another rate: the test can fail.
    assert stats.kstest(gaps, "expon", args=(0, 1 / 25)).pvalue < 0.01


def test_constant_gaps_are_exact_and_gamma_follows_vllms_burstiness():
    assert np.allclose(np.diff(_schedule(kind="constant", rate_rps=4, requests=9)), 0.25)
    for burstiness in (0.25, 4.0):
        gaps = np.diff(
            _schedule(2, kind="gamma", rate_rps=10, requests=20000, burstiness=burstiness)
        )
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / np.sqrt(burstiness), rel=0.05)
        shape = burstiness
        assert stats.kstest(gaps, "gamma", args=(shape, 0, 0.1 / shape)).pvalue > 0.01


def test_duration_bounds_the_schedule_and_the_ramp_raises_the_rate_linearly():
    flat = _schedule(kind="constant", rate_rps=10, duration_s=3)
    assert len(flat) == 30 and max(flat) < 3
    ramped = np.array(_schedule(kind="constant", rate_rps=100, duration_s=20, ramp_s=10))
    # Over a linear ramp from 0 to 100 requests/s the count grows with the square of time.
    assert (ramped < 5).sum() == pytest.approx(100 * 5**2 / 20, abs=2)
    assert (ramped < 10).sum() == pytest.approx(500, abs=2)
    assert ((ramped >= 10) & (ramped < 11)).sum() == pytest.approx(100, abs=2)
    arrival = ARRIVALS.parse({"kind": "constant", "rate_rps": 100, "duration_s": 20, "ramp_s": 10})
    assert arrival.expected_requests() == pytest.approx(len(ramped), abs=2)
    both = _schedule(kind="constant", rate_rps=10, duration_s=3, requests=5)
    assert len(both) == 5  # whichever bound comes first


def test_shares_hold_every_request_exactly_once():
    offsets = _schedule(3, kind="poisson", rate_rps=30, requests=101)
    parts = [share(offsets, i, 3) for i in range(3)]
    positions = sorted(p for part in parts for p, _ in part)
    assert positions == list(range(101))
    assert all(offsets[p] == t for part in parts for p, t in part)
    with pytest.raises(ValueError, match="share 3 of 3"):
        share(offsets, 3, 3)


def test_group_errors_name_the_problem():
    base = {"name": "g", "prompt_tokens": 8, "max_tokens": 8}
    with pytest.raises(ValidationError, match="users and requests_per_user are required"):
        UserGroupConfig(**base)
    with pytest.raises(ValidationError, match="requests_per_user is required"):
        UserGroupConfig(**base, users=2)
    with pytest.raises(ValidationError, match="users do not apply to an open-loop group"):
        UserGroupConfig(**base, users=2, arrival={"kind": "poisson", "rate_rps": 1, "requests": 3})
    with pytest.raises(ValidationError, match="needs requests, duration_s or both"):
        UserGroupConfig(**base, arrival={"kind": "poisson", "rate_rps": 1})
    with pytest.raises(ValidationError, match="burstiness"):
        UserGroupConfig(**base, arrival={"kind": "poisson", "rate_rps": 1, "requests": 1,
                                         "burstiness": 2})  # fmt: skip
    group = UserGroupConfig(**base, arrival={"kind": "gamma", "rate_rps": 5, "duration_s": 2})
    assert group.open_loop and group.locust_users(3) == 3
    assert UserGroupConfig(**base, users=4, requests_per_user=1).locust_users(3) == 4


def test_client_mix_entries_take_the_groups_defaults_and_need_distinct_names():
    base = {"name": "g", "users": 1, "requests_per_user": 1, "rcvbuf_bytes": 4096}
    group = UserGroupConfig(
        **base,
        mix=[  # fmt: skip
            {"weight": 9},
            {"weight": 1, "read": {"kind": "paced"},
             "action": {"kind": "half_close", "after_tokens": 4}},
        ],
    )
    full, paced = group.behaviours()
    assert (full.name, full.read.kind, full.rcvbuf_bytes) == ("full_speed", "full_speed", 4096)
    assert paced.name == "paced-half_close"
    with pytest.raises(ValidationError, match="behaviour names must differ"):
        UserGroupConfig(**base, mix=[{"weight": 1}, {"weight": 2}])
    with pytest.raises(ValidationError, match="weight"):
        UserGroupConfig(**base, mix=[{"weight": 0}])
    with pytest.raises(ValidationError, match="pause of 200 s must be shorter than timeout_s"):
        stop = {"kind": "stop_reading", "after_tokens": 1, "hold_s": 200}
        UserGroupConfig(**base, mix=[{"weight": 1, "action": stop}])
