"""Paged KV-cache block manager with a prefix cache: a fixed pool of blocks handed out to
requests, full blocks kept for reuse after their request freed them.

The model is vLLM v1's paged attention with automatic prefix caching
(vllm/v1/core/block_pool.py ``BlockPool``, vllm/v1/core/kv_cache_utils.py
``FreeKVCacheBlockQueue``, vllm/v1/core/kv_cache_manager.py ``get_computed_blocks``):

- a request holding ``n`` token slots owns ``ceil(n / block_size)`` blocks; blocks are
  allocated as it grows and all of its blocks are released at once (finish, preemption, abort
  or delivery);
- given the chained hashes of a request's full blocks (:func:`extend_block_hashes`), a block
  is *cached* under its hash once allocated for those tokens; a new request starts with the
  longest run of its leading full blocks found cached (at most ``num_tokens - 1`` tokens, so
  that one token is always computed), shared with their other holders (reference counts);
- a released block whose reference count falls to 0 goes to the free queue: without a hash to
  its front (reused first, LIFO), with one to its back (least recently freed first: LRU), and
  stays findable there until an allocation takes it from the front (evicting its hash) or a
  request hits it (taking it out of the queue).

Blocks *in use* (``num_used_blocks``, what ``usage`` is a fraction of, as vLLM's
``BlockPool.get_usage``) are those with a reference; blocks *cached-free*
(``num_cached_free_blocks``) are free ones that still carry a hash: memory kept for reuse,
free for any allocation. Without hashes (prefix caching off) no block is ever shared or cached.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


def extend_block_hashes(
    hashes: list[int], tokens: Sequence[Hashable], block_size: int, start: int = 0
) -> None:
    """Append to ``hashes`` the chained hash of each full block of ``tokens`` that it lacks:
    block ``i``'s hash covers its own tokens and block ``i - 1``'s hash (vLLM's
    ``hash_block_tokens`` in vllm/v1/core/kv_cache_utils.py), so equal hashes mean equal
    prefixes. ``tokens`` may begin at token ``start`` (a multiple of ``block_size``, at most
    ``len(hashes) * block_size``) of the sequence. Hashes are Python's ``hash``: stable within
    one process, which is all one engine needs."""
    parent = hashes[-1] if hashes else None
    first = len(hashes) * block_size - start
    for i in range(first, len(tokens) - block_size + 1, block_size):
        parent = hash((parent, tuple(tokens[i : i + block_size])))
        hashes.append(parent)


class BlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens each (module docstring).

    Requests are identified by any hashable key (the emulator uses its request ids).
    Invariants (checked by the property tests): a block is either free (reference count 0,
    in the free queue) or owned (its reference count is the number of requests holding it),
    ``num_used_blocks`` counts each owned block once, a hash names at most one block, and
    ``num_cached_free_blocks`` is the number of free blocks that carry a hash.
    """

    __slots__ = ("block_size", "num_blocks", "_free", "_owned", "_ref", "_hash", "_cached",
                 "_num_hashed", "_cached_free")  # fmt: skip

    def __init__(self, *, block_size: int, num_blocks: int) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError("block_size and num_blocks must be at least 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._owned: dict[object, list[int]] = {}
        self._ref = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._cached: dict[int, int] = {}  # block hash -> the block that carries it
        self._num_hashed: dict[object, int] = {}  # key -> its leading blocks with a hash
        self._cached_free = 0

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` token slots (ceil division)."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, key: object, num_tokens: int) -> bool:
        """Whether ``key`` could grow to hold ``num_tokens`` slots with the free blocks."""
        have = len(self._owned.get(key, ()))
        return self.blocks_for(num_tokens) - have <= len(self._free)

    def _hits(self, block_hashes: Sequence[int], num_tokens: int) -> list[int]:
        """The blocks of the longest cached prefix of ``block_hashes``, at most
        ``num_tokens - 1`` tokens' worth (vLLM's ``max_cache_hit_length``)."""
        hits: list[int] = []
        cached = self._cached
        for h in block_hashes[: (num_tokens - 1) // self.block_size]:
            block = cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def num_cached_tokens(self, block_hashes: Sequence[int], num_tokens: int) -> int:
        """Tokens a request of ``num_tokens`` tokens whose full blocks hash to
        ``block_hashes`` would find in the cache now (whole blocks; what :meth:`allocate`
        reuses for a key that holds nothing)."""
        return len(self._hits(block_hashes, num_tokens)) * self.block_size

    def allocate(self, key: object, num_tokens: int, block_hashes: Sequence[int] = ()) -> bool:
        """Grow ``key``'s blocks to hold ``num_tokens`` token slots, then cache its full
        blocks under ``block_hashes`` (the hashes of its full blocks so far, in order).

        A key that holds nothing starts with the cached blocks of its longest cached prefix
        (:meth:`num_cached_tokens`). New blocks come from the front of the free queue; one
        that carries a hash loses it (eviction). Returns False, changing nothing, when the
        free blocks do not suffice. Never shrinks: a smaller ``num_tokens`` than already held
        allocates nothing (and returns True).
        """
        blocks = self._owned.get(key)
        if blocks is not None:  # growing: the hot path, one call per running request and step
            need = self.blocks_for(num_tokens) - len(blocks)
            if need > len(self._free):
                return False
            if need > 0:
                self._take(blocks, need)
            if len(block_hashes) > self._num_hashed[key]:
                self._cache(key, blocks, block_hashes)
            return True
        ref = self._ref
        hits = self._hits(block_hashes, num_tokens) if block_hashes else []
        need = self.blocks_for(num_tokens) - len(hits)
        reclaimed = sum(1 for b in hits if ref[b] == 0)  # leave the free queue, not evicted
        if need + reclaimed > len(self._free):
            return False
        for b in hits:
            if ref[b] == 0:
                del self._free[b]
                self._cached_free -= 1
            ref[b] += 1
        blocks = self._owned[key] = hits
        self._num_hashed[key] = len(hits)
        self._take(blocks, need)
        if len(block_hashes) > self._num_hashed[key]:
            self._cache(key, blocks, block_hashes)
        return True

    def _take(self, blocks: list[int], n: int) -> None:
        """Append ``n`` blocks from the front of the free queue to ``blocks``, evicting the
        hash of any that carries one."""
        free, hashes, ref = self._free, self._hash, self._ref
        for _ in range(n):
            b = free.popitem(last=False)[0]
            if (h := hashes[b]) is not None:
                del self._cached[h]
                hashes[b] = None
                self._cached_free -= 1
            ref[b] = 1
            blocks.append(b)

    def _cache(self, key: object, blocks: list[int], block_hashes: Sequence[int]) -> None:
        """Give ``key``'s full blocks not cached yet their hashes; a hash another block
        already carries stays that block's (the cache holds one block per hash)."""
        done = self._num_hashed[key]
        upto = min(len(block_hashes), len(blocks))
        for i in range(done, upto):
            h, b = block_hashes[i], blocks[i]
            if h not in self._cached and self._hash[b] is None:
                self._cached[h] = b
                self._hash[b] = h
        self._num_hashed[key] = max(done, upto)

    def free(self, key: object) -> int:
        """Release all of ``key``'s blocks; the number of blocks it held (shared ones too).

        A block no one else holds goes to the free queue (module docstring). Raises
        ``KeyError`` if ``key`` holds no blocks (a double free is a bug).
        """
        blocks = self._owned.pop(key)
        del self._num_hashed[key]
        ref, free = self._ref, self._free
        for b in reversed(blocks):  # the tail of a chain is evicted first, as in vLLM
            ref[b] -= 1
            if ref[b]:
                continue
            free[b] = None
            if self._hash[b] is None:
                free.move_to_end(b, last=False)
            else:
                self._cached_free += 1
        return len(blocks)

    def holds(self, key: object) -> bool:
        """Whether ``key`` currently owns at least one block."""
        return key in self._owned

    def blocks_of(self, key: object) -> tuple[int, ...]:
        """The block ids owned by ``key`` (empty if none)."""
        return tuple(self._owned.get(key, ()))

    def owners(self) -> list[object]:
        """Keys that currently own blocks."""
        return list(self._owned)

    def ref_count(self, block: int) -> int:
        """How many keys hold ``block``."""
        return self._ref[block]

    def block_hash(self, block: int) -> int | None:
        """The hash ``block`` is cached under, or None."""
        return self._hash[block]

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue, cached-free ones included (vLLM's
        ``get_num_free_blocks``)."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks held by at least one request, each counted once."""
        return self.num_blocks - len(self._free)

    @property
    def num_cached_free_blocks(self) -> int:
        """Free blocks that still carry a hash (kept for reuse, evictable); O(1)."""
        return self._cached_free

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``: cached-free blocks
        count as free)."""
        return self.num_used_blocks / self.num_blocks
