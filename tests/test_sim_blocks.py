"""Property tests of the emulator's paged KV block manager (no double free, no leak)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness._sim._blocks import BlockManager

KEYS = st.sampled_from([f"r{i}" for i in range(6)])


class BlockMachine(RuleBasedStateMachine):
    """Random allocate/free sequences against a model of who should own how many blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(block_size=4, num_blocks=16)
        self.model: dict[str, int] = {}  # key -> blocks it must own

    @rule(key=KEYS, num_tokens=st.integers(min_value=1, max_value=80))
    def allocate(self, key: str, num_tokens: int) -> None:
        have = self.model.get(key, 0)
        need = -(-num_tokens // 4)
        free_before = self.bm.num_free_blocks
        ok = self.bm.allocate(key, num_tokens)
        if need <= have:
            assert ok
        elif need - have <= free_before:
            assert ok
            self.model[key] = need
        else:
            assert not ok
            assert self.bm.num_free_blocks == free_before  # nothing partially allocated

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def free_held(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.model)))
        assert self.bm.free(key) == self.model.pop(key)

    @rule(key=KEYS)
    def free_unheld_raises(self, key: str) -> None:
        if key in self.model:
            return
        with pytest.raises(KeyError):
            self.bm.free(key)

    @invariant()
    def no_leak_no_double_ownership(self) -> None:
        owned = [b for key in self.bm.owners() for b in self.bm.blocks_of(key)]
        free = list(self.bm._free)
        assert len(set(owned)) == len(owned), "a block is owned twice"
        assert len(set(free)) == len(free), "a block is free twice (double free)"
        assert not set(owned) & set(free), "a block is both owned and free"
        assert set(owned) | set(free) == set(range(16)), "a block leaked"

    @invariant()
    def usage_is_sum_of_live_requests(self) -> None:
        assert self.bm.num_used_blocks == sum(self.model.values())
        assert self.bm.usage == pytest.approx(sum(self.model.values()) / 16)
        assert {k for k in self.bm.owners()} == set(self.model)


TestBlockMachine = BlockMachine.TestCase
TestBlockMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_blocks_for_is_ceil_division() -> None:
    bm = BlockManager(block_size=32, num_blocks=4)
    assert [bm.blocks_for(n) for n in (1, 32, 33, 64, 65)] == [1, 1, 2, 2, 3]
    assert bm.can_allocate("a", 128) and not bm.can_allocate("a", 129)


def test_rejects_empty_pool() -> None:
    with pytest.raises(ValueError):
        BlockManager(block_size=0, num_blocks=4)
