"""Run in a process of its own (it imports vLLM): random allocations, prefix hits, frees,
evictions and resets on vLLM's own ``BlockPool``, checking after each that the probe's
incremental count of cached-free blocks equals a walk of the free queue. Prints the number of
operations checked and the largest count seen."""

from __future__ import annotations

import random
import sys

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import BlockHash, make_block_hash_with_group_id

from harness._engine_probe._vllm_blocks import CachedFreeCounter


def main(seed: int, operations: int) -> None:
    rng = random.Random(seed)
    pool = BlockPool(num_gpu_blocks=40, enable_caching=True, hash_block_size=4)
    counter = CachedFreeCounter.attach(pool)
    assert counter is not None
    owned: list[list] = []  # each request's blocks, in order
    hashes = [make_block_hash_with_group_id(BlockHash(bytes([i])), 0) for i in range(60)]
    peak = 0
    for _ in range(operations):
        op = rng.random()
        if op < 0.35 and pool.get_num_free_blocks() >= 4:
            blocks = pool.get_new_blocks(rng.randint(1, 4))
            for block in blocks:  # cache some of them (what cache_full_blocks does)
                h = rng.choice(hashes)
                if rng.random() < 0.7 and pool.get_cached_block(h[:-4], [0]) is None:
                    pool._insert_block_hash(h, block, num_tokens=4)
            owned.append(blocks)
        elif op < 0.45:  # a prefix hit: take cached blocks, free or in use
            hits = [b for b in (pool.get_cached_block(h[:-4], [0]) for h in hashes) if b]
            if hits:
                chosen = [b[0] for b in rng.sample(hits, min(len(hits), rng.randint(1, 3)))]
                pool.touch(chosen)
                owned.append(chosen)
        elif op < 0.9 and owned:  # a request ends
            pool.free_blocks(reversed(owned.pop(rng.randrange(len(owned)))))
        elif op < 0.95:
            pool.evict_blocks({rng.randrange(1, 40) for _ in range(2)})
        if not owned and rng.random() < 0.2:
            assert pool.reset_prefix_cache()
        assert counter.count == counter.walk(), (counter.count, counter.walk())
        assert counter.in_use == 39 - pool.get_num_free_blocks()
        peak = max(peak, counter.count)
    print(operations, peak)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
