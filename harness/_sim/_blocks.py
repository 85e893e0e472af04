"""Paged KV-cache block manager: a fixed pool of blocks handed out to requests.

The model is vLLM's paged attention: a request holding ``n`` token slots owns
``ceil(n / block_size)`` blocks; blocks are allocated as the request grows and all of a
request's blocks are freed at once (finish, preemption, abort or delivery). No prefix
caching: blocks are never shared.
"""

from __future__ import annotations


class BlockManager:
    """A pool of ``num_blocks`` KV blocks of ``block_size`` tokens each.

    Requests are identified by any hashable key (the emulator uses its request ids).
    Invariants (checked by the property tests): a block is owned by at most one request,
    every block is either free or owned, and ``num_used_blocks`` equals the sum of the
    owned blocks of live requests.
    """

    __slots__ = ("block_size", "num_blocks", "_free", "_owned")

    def __init__(self, *, block_size: int, num_blocks: int) -> None:
        if block_size < 1 or num_blocks < 1:
            raise ValueError("block_size and num_blocks must be at least 1")
        self.block_size = block_size
        self.num_blocks = num_blocks
        # LIFO free list: a freed block is the next one handed out, like vLLM's free queue
        # for blocks without cached content.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._owned: dict[object, list[int]] = {}

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` token slots (ceil division)."""
        return -(-num_tokens // self.block_size)

    def can_allocate(self, key: object, num_tokens: int) -> bool:
        """Whether ``key`` could grow to hold ``num_tokens`` slots with the free blocks."""
        have = len(self._owned.get(key, ()))
        return self.blocks_for(num_tokens) - have <= len(self._free)

    def allocate(self, key: object, num_tokens: int) -> bool:
        """Grow ``key``'s blocks to hold ``num_tokens`` token slots.

        Returns False, allocating nothing, when the free blocks do not suffice. Never
        shrinks: a smaller ``num_tokens`` than already held is a no-op returning True.
        """
        blocks = self._owned.get(key)
        have = 0 if blocks is None else len(blocks)
        need = self.blocks_for(num_tokens) - have
        if need <= 0:
            return True
        if need > len(self._free):
            return False
        if blocks is None:
            blocks = self._owned[key] = []
        for _ in range(need):
            blocks.append(self._free.pop())
        return True

    def free(self, key: object) -> int:
        """Return all of ``key``'s blocks to the pool; the number of blocks freed.

        Raises ``KeyError`` if ``key`` holds no blocks (a double free is a bug).
        """
        blocks = self._owned.pop(key)
        self._free.extend(reversed(blocks))
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

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the pool."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        """Blocks owned by requests."""
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0..1 (vLLM's ``kv_cache_usage_perc``)."""
        return self.num_used_blocks / self.num_blocks
