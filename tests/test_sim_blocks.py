"""Property tests of the emulator's paged KV block manager (no double free, no leak)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from harness._sim._blocks import BlockManager, extend_block_hashes

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


# -- prefix caching: shared and cached-free blocks ------------------------------------------

PROMPTS = ((1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12), (1, 2, 3, 4, 9, 9, 9, 9, 9, 9, 9, 9))


def _hashes(tokens: tuple[int, ...], block_size: int = 4) -> list[int]:
    out: list[int] = []
    extend_block_hashes(out, tokens, block_size)
    return out


class SharedBlockMachine(RuleBasedStateMachine):
    """Requests whose prompts share prefixes: allocate (hitting cached blocks), grow, free."""

    def __init__(self) -> None:
        super().__init__()
        self.bm = BlockManager(block_size=4, num_blocks=12)
        self.tokens: dict[str, tuple[int, ...]] = {}

    @precondition(lambda self: len(self.tokens) < 6)
    @rule(key=KEYS, prompt=st.sampled_from(PROMPTS), n=st.integers(min_value=1, max_value=12))
    def admit(self, key: str, prompt: tuple[int, ...], n: int) -> None:
        if key in self.tokens:
            return
        tokens = prompt[:n]
        hashes = _hashes(tokens)
        hits = self.bm.num_cached_tokens(hashes, n) // 4
        assert hits * 4 <= n - 1  # one token is always computed
        refs = [self.bm.ref_count(b) for b in self.bm._hits(hashes, n)]
        if self.bm.allocate(key, n, hashes):
            self.tokens[key] = tokens
            shared = self.bm.blocks_of(key)[:hits]
            assert [self.bm.ref_count(b) for b in shared] == [r + 1 for r in refs]
            assert len(self.bm.blocks_of(key)) == -(-n // 4)

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data(), more=st.integers(min_value=1, max_value=6))
    def grow(self, data: st.DataObject, more: int) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens = self.tokens[key] + (100 + len(key),) * more
        if self.bm.allocate(key, len(tokens), _hashes(tokens)):
            self.tokens[key] = tokens

    @precondition(lambda self: bool(self.tokens))
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.tokens)))
        n = len(self.tokens.pop(key))
        assert self.bm.free(key) == -(-n // 4)

    @invariant()
    def a_block_is_free_or_owned_with_its_ref_count(self) -> None:
        bm = self.bm
        owned = [b for key in bm.owners() for b in bm.blocks_of(key)]
        free = list(bm._free)
        assert all(len(set(bm.blocks_of(k))) == len(bm.blocks_of(k)) for k in bm.owners())
        assert len(set(free)) == len(free)
        assert not set(owned) & set(free)
        assert set(owned) | set(free) == set(range(12))
        for b in range(12):
            assert bm.ref_count(b) == owned.count(b)
        assert bm.num_used_blocks == len(set(owned))

    @invariant()
    def cached_free_blocks_counted_once(self) -> None:
        bm = self.bm
        hashed_free = [b for b in bm._free if bm.block_hash(b) is not None]
        assert bm.num_cached_free_blocks == len(hashed_free)
        assert all(bm.block_hash(b) == h for h, b in bm._cached.items())
        assert len(bm._cached) == sum(bm.block_hash(b) is not None for b in range(12))


TestSharedBlockMachine = SharedBlockMachine.TestCase
TestSharedBlockMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_a_freed_prefix_is_reused_and_evicted_least_recently_freed_first() -> None:
    bm = BlockManager(block_size=2, num_blocks=4)
    a = (1, 2, 3, 4)
    assert bm.allocate("a", 4, _hashes(a, 2)) and bm.num_cached_free_blocks == 0
    assert bm.free("a") == 2
    assert bm.num_cached_free_blocks == 2 and bm.num_used_blocks == 0 and bm.usage == 0
    # A request sharing the whole prompt reuses at most all but its last token: one block.
    assert bm.num_cached_tokens(_hashes(a, 2), 4) == 2
    assert bm.num_cached_tokens(_hashes((1, 2, 3, 4, 5), 2), 5) == 4
    # Uncached free blocks go first; then the tail of a's chain is evicted, its head kept.
    assert bm.allocate("b", 4) and bm.num_cached_free_blocks == 2
    assert bm.allocate("c", 2) and bm.num_cached_free_blocks == 1
    assert bm.num_cached_tokens(_hashes((1, 2, 3, 4, 5), 2), 5) == 2
    assert bm.allocate("d", 5, _hashes((1, 2, 3, 4, 5), 2)) is False  # 2 new blocks, 0 free
    bm.free("b")
    assert bm.allocate("d", 5, _hashes((1, 2, 3, 4, 5), 2))
    assert bm.num_cached_free_blocks == 0 and bm.ref_count(bm.blocks_of("d")[0]) == 1


def test_without_hashes_nothing_is_cached() -> None:
    bm = BlockManager(block_size=2, num_blocks=4)
    assert bm.allocate("a", 4)
    bm.free("a")
    assert bm.num_cached_free_blocks == 0 and bm.num_cached_tokens(_hashes((1, 2, 3, 4), 2), 4) == 0
