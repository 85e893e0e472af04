"""The emulator's scheduler driven step by step with a fake clock (time is the subject here)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness._sim._config import SimConfig
from harness._sim._scheduler import EOS_TOKEN_ID, Scheduler, SimRequest, Status


def _cfg(**kw: object) -> SimConfig:
    base: dict[str, object] = dict(
        block_size=4, num_blocks=16, max_num_seqs=4, max_model_len=64, step_fixed_ms=1.0
    )
    base.update(kw)
    return SimConfig(**base)


def _check_invariants(s: Scheduler) -> None:
    bm = s.blocks
    holders = {r.request_id for r in s.running} | set(s.held)
    assert set(bm.owners()) <= holders, "a request not running or held owns blocks"
    assert bm.num_used_blocks == sum(len(bm.blocks_of(k)) for k in holders)
    for r in s.waiting:
        assert not bm.holds(r.request_id) and r.num_computed_tokens == 0
    for r in s.running:
        # every running request owns the slots of its computed tokens
        assert len(bm.blocks_of(r.request_id)) * bm.block_size >= r.num_computed_tokens
    assert len(s.running) <= s.config.max_num_seqs


@dataclass
class Arrival:
    at_step: int
    prompt_len: int
    max_tokens: int
    ignore_eos: bool
    abort_after: int | None  # steps after arrival; None = never
    delivery_steps: int  # on_delivery: steps between end of generation and delivery


arrivals = st.lists(
    st.builds(
        Arrival,
        at_step=st.integers(0, 30),
        prompt_len=st.integers(1, 30),
        max_tokens=st.integers(1, 30),
        ignore_eos=st.booleans(),
        abort_after=st.one_of(st.none(), st.integers(0, 40)),
        delivery_steps=st.integers(0, 10),
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    arrivals=arrivals,
    kv_release=st.sampled_from(["on_finish", "on_delivery"]),
    num_blocks=st.integers(16, 40),
    max_num_seqs=st.integers(1, 8),
    budget=st.integers(16, 128),
)
def test_every_admitted_request_finishes_or_is_aborted(
    arrivals: list[Arrival], kv_release: str, num_blocks: int, max_num_seqs: int, budget: int
) -> None:
    cfg = _cfg(
        kv_release=kv_release,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        eos_probability=0.05,
    )
    s = Scheduler(cfg)
    now = 0.0
    reqs: dict[str, tuple[SimRequest, Arrival]] = {}
    finished_at: dict[str, int] = {}
    for step_no in range(2000):
        for i, a in enumerate(arrivals):
            if a.at_step == step_no:
                r = SimRequest(f"q{i}", a.prompt_len, a.max_tokens, a.ignore_eos, seed=i)
                s.add_request(r)
                reqs[r.request_id] = (r, a)
        for rid, (r, a) in reqs.items():
            if a.abort_after is not None and step_no == a.at_step + a.abort_after:
                if s.abort(rid, now):
                    assert r.finish_reason == "abort" and not s.blocks.holds(rid)
            if rid in s.held and step_no >= finished_at[rid] + a.delivery_steps:
                assert s.release(rid)
        step = s.schedule(now)
        _check_invariants(s)
        if step is not None:
            assert step.duration_s > 0
            now += step.duration_s
            for out in s.complete(step, now):
                if out.finish_reason is not None:
                    finished_at[out.request.request_id] = step_no
            _check_invariants(s)
        if len(reqs) == len(arrivals) and not s.requests:
            break
    assert not s.requests, f"requests never finished: {sorted(s.requests)}"
    assert s.blocks.num_used_blocks == 0, "blocks leaked"
    for r, a in reqs.values():
        assert r.status is Status.DONE
        assert r.finish_reason in ("stop", "length", "abort")
        if r.finish_reason == "length":
            assert len(r.output_token_ids) == a.max_tokens
        if r.finish_reason == "stop":
            assert not a.ignore_eos and r.output_token_ids[-1] == EOS_TOKEN_ID
        if a.ignore_eos:
            assert EOS_TOKEN_ID not in r.output_token_ids


def _run_until_done(s: Scheduler, limit: int = 10_000) -> float:
    now = 0.0
    for _ in range(limit):
        step = s.schedule(now)
        if step is None:
            return now
        now += step.duration_s
        s.complete(step, now)
    raise AssertionError("did not finish")


def test_step_time_model() -> None:
    cfg = _cfg(step_fixed_ms=2.0, prefill_ms_per_token=0.5, decode_ms_per_seq=0.25)
    s = Scheduler(cfg)
    s.add_request(SimRequest("a", prompt_len=10, max_tokens=5, ignore_eos=True))
    s.add_request(SimRequest("b", prompt_len=6, max_tokens=5, ignore_eos=True))
    first = s.schedule(0.0)
    assert first is not None
    assert first.num_prefill_tokens == 16 and first.num_decode_seqs == 0
    assert first.duration_s == pytest.approx((2.0 + 0.5 * 16) / 1000)
    s.complete(first, first.duration_s)
    second = s.schedule(first.duration_s)
    assert second is not None
    assert second.num_prefill_tokens == 0 and second.num_decode_seqs == 2
    assert second.duration_s == pytest.approx((2.0 + 0.25 * 2) / 1000)


def test_max_num_seqs_and_exact_max_tokens() -> None:
    s = Scheduler(_cfg(max_num_seqs=2, num_blocks=64))
    reqs = [SimRequest(f"r{i}", 3, 7, ignore_eos=True) for i in range(5)]
    for r in reqs:
        s.add_request(r)
    step = s.schedule(0.0)
    assert step is not None and len(step.requests) == 2 and s.num_waiting == 3
    s.complete(step, 0.001)
    _run_until_done(s)
    assert all(len(r.output_token_ids) == 7 and r.finish_reason == "length" for r in reqs)
    assert s.blocks.num_used_blocks == 0


def test_recompute_preemption_of_most_recent_request() -> None:
    # 4 blocks of 4 tokens: A and B fit at first (2 blocks each), then must grow.
    s = Scheduler(_cfg(block_size=4, num_blocks=4, max_model_len=16))
    a = SimRequest("a", prompt_len=4, max_tokens=12, ignore_eos=True)
    b = SimRequest("b", prompt_len=4, max_tokens=12, ignore_eos=True)
    s.add_request(a)
    s.add_request(b)
    now = 0.0
    preempted_step = None
    for _ in range(20):
        step = s.schedule(now)
        assert step is not None
        if step.num_preempted:
            preempted_step = step
            break
        now += step.duration_s
        s.complete(step, now)
    assert preempted_step is not None
    # B, the most recently admitted, is the victim: back at the front of the queue, KV gone.
    assert b.status is Status.WAITING and s.waiting[0] is b and b.num_preemptions == 1
    assert b.num_computed_tokens == 0 and not s.blocks.holds("b")
    generated = len(b.output_token_ids)
    assert generated > 0
    _run_until_done(s)
    # B recomputed prompt + generated tokens and kept its output.
    assert len(b.output_token_ids) == 12 and b.finish_reason == "length"
    assert s.num_preemptions_total >= 1


def test_on_delivery_holds_blocks_until_release() -> None:
    s = Scheduler(_cfg(kv_release="on_delivery"))
    r = SimRequest("r", prompt_len=5, max_tokens=3, ignore_eos=True)
    s.add_request(r)
    _run_until_done(s)
    assert r.status is Status.HELD and s.num_running == 0 and s.num_held == 1
    assert s.blocks.num_used_blocks == 2  # 5 prompt + 2 computed outputs = 7 slots
    assert not s.abort("r", 1.0), "a held request has finished: abort does not apply"
    assert s.release("r") and s.blocks.num_used_blocks == 0 and r.status is Status.DONE
    assert not s.release("r")


def test_on_finish_frees_at_last_token() -> None:
    s = Scheduler(_cfg(kv_release="on_finish"))
    r = SimRequest("r", prompt_len=5, max_tokens=3, ignore_eos=True)
    s.add_request(r)
    _run_until_done(s)
    assert r.status is Status.DONE and s.blocks.num_used_blocks == 0


def test_held_blocks_starve_admission() -> None:
    s = Scheduler(_cfg(kv_release="on_delivery", block_size=4, num_blocks=8, max_model_len=32))
    hog = SimRequest("hog", prompt_len=20, max_tokens=8, ignore_eos=True)  # 7 blocks held
    s.add_request(hog)
    _run_until_done(s)
    victim = SimRequest("v", prompt_len=8, max_tokens=4, ignore_eos=True)
    s.add_request(victim)
    assert s.schedule(1.0) is None and s.num_waiting == 1  # KV held by an undelivered stream
    s.release("hog")
    _run_until_done(s)
    assert s.num_held == 1 and victim.finish_reason == "length"


def test_token_text_is_deterministic_from_seed() -> None:
    def run(seed: int) -> list[int]:
        s = Scheduler(_cfg())
        r = SimRequest("r", 3, 20, ignore_eos=True, seed=seed)
        s.add_request(r)
        _run_until_done(s)
        return r.output_token_ids

    assert run(1) == run(1) != run(2)


def test_add_request_validation() -> None:
    s = Scheduler(_cfg(max_model_len=16))
    with pytest.raises(ValueError):
        s.add_request(SimRequest("x", prompt_len=10, max_tokens=7))
    s.add_request(SimRequest("y", prompt_len=10, max_tokens=6))
    with pytest.raises(ValueError):
        s.add_request(SimRequest("y", prompt_len=1, max_tokens=1))


def test_config_rejects_max_model_len_above_cache() -> None:
    with pytest.raises(ValueError):
        SimConfig(block_size=4, num_blocks=4, max_model_len=17)


def test_min_tokens_holds_off_eos_until_then():
    """vLLM's ``min_tokens``: no EOS before that many tokens, even where EOS is likely."""
    cfg = _cfg(eos_probability=0.5)
    lengths = {}
    for min_tokens in (0, 30):
        s = Scheduler(cfg)
        requests = [SimRequest(f"q{i}", 4, 40, False, min_tokens=min_tokens, seed=i)
                    for i in range(8)]  # fmt: skip
        for r in requests:
            s.add_request(r)
        now = 0.0
        while (step := s.schedule(now)) is not None:
            now += step.duration_s
            s.complete(step, now)
        lengths[min_tokens] = [len(r.output_token_ids) for r in requests]
    assert min(lengths[30]) >= 30 and max(lengths[0]) < 30
