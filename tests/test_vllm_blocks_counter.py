"""The cached-free block counter's wrappers on a pool shaped otherwise than vLLM 0.32's (no
vLLM needed): counting stops and says why, and the pool's methods still do their work."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from harness._engine_probe._vllm_blocks import CachedFreeCounter


class _Block:
    def __init__(self) -> None:
        self.prev_free_block: Any = None
        self.next_free_block: Any = None
        self.block_hash: Any = None


class _Queue:
    def __init__(self) -> None:
        self.fake_free_list_head, self.fake_free_list_tail = _Block(), _Block()
        self.fake_free_list_head.next_free_block = self.fake_free_list_tail
        self.items: list[Any] = []

    def append(self, block: Any) -> None:
        self.items.append(block)

    def append_n(self, blocks: list[Any]) -> None:
        self.items.extend(blocks)

    def prepend_n(self, blocks: list[Any]) -> None:
        self.items[:0] = blocks

    def popleft(self) -> Any:
        return self.items.pop(0)

    def popleft_n(self, n: int) -> list[Any]:
        out, self.items = self.items[:n], self.items[n:]
        return out

    def remove(self, block: Any) -> None:
        self.items.remove(block)


class _Pool:
    num_gpu_blocks = 8

    def __init__(self) -> None:
        self.free_block_queue = _Queue()

    def get_num_free_blocks(self) -> int:
        return len(self.free_block_queue.items)

    def _insert_block_hash(self, block_hash: Any, block: Any) -> None:
        block.block_hash = block_hash

    def _remove_cached_block_hashes(self, block: Any) -> None:
        block.block_hash = None

    def reset_prefix_cache(self) -> bool:
        return True


def test_a_block_shaped_otherwise_stops_the_count_not_the_pool() -> None:
    pool = _Pool()
    counter = CachedFreeCounter.attach(pool)
    assert counter is not None and counter.count == 0
    hashed = _Block()
    hashed.block_hash = "h"
    pool.free_block_queue.append(hashed)
    assert counter.count == 1 and counter.in_use == 8 - 1 - 1
    pool.free_block_queue.append(object())  # no block_hash: not a vLLM 0.32 block
    assert counter.count is None and counter.error and "AttributeError" in counter.error
    assert len(pool.free_block_queue.items) == 2  # the append itself happened
    assert pool.free_block_queue.popleft() is hashed  # and the pool goes on working
    odd = SimpleNamespace()  # no free-list links
    pool._insert_block_hash("x", odd)  # a hash change on such a block: still done, no raise
    assert odd.block_hash == "x"
    assert pool.reset_prefix_cache() is True and counter.count is None
