"""KV blocks in use and blocks kept for reuse (free, still cached) in vLLM's block pool, counted
at every engine step without walking the pool.

vLLM v1 keeps a freed full block's prefix-cache hash (vllm/v1/core/block_pool.py
``BlockPool.free_blocks``): the block joins the free queue (vllm/v1/core/kv_cache_utils.py
``FreeKVCacheBlockQueue``) and counts as free in ``get_usage`` (``1 - free / (blocks - 1)``, the
null block left out: so ``kv_cache_usage`` is blocks *in use* only), yet a later request with
the same prefix takes it back (``touch``) until an allocation evicts it
(``get_new_blocks`` -> ``_maybe_evict_cached_block``). Blocks in use are O(1) from the free
queue's length. Blocks free-but-cached would take a walk of the free queue (O(free blocks): a
GPU server has 100k+) at every step; :class:`CachedFreeCounter` instead keeps the count
incrementally by wrapping, on the one pool instance, every method through which a block enters
or leaves the free queue (``popleft``, ``popleft_n``, ``remove``, ``append``, ``append_n``,
``prepend_n``) or gains or loses its hash (``BlockPool._insert_block_hash``,
``_remove_cached_block_hashes``, ``reset_prefix_cache``): each wrapper costs a call and a look
at the blocks vLLM itself moves. :meth:`CachedFreeCounter.walk` counts by walking, for tests.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

QUEUE_IN = ("append", "append_n", "prepend_n")
QUEUE_OUT = ("popleft", "popleft_n", "remove")
HASH_CHANGES = ("_insert_block_hash", "_remove_cached_block_hashes")
"""The methods :class:`CachedFreeCounter` wraps (queue: ``FreeKVCacheBlockQueue``; hashes:
``BlockPool``); a pool without one of them is not counted (:meth:`CachedFreeCounter.attach`)."""


def _cached_free(block: Any) -> bool:
    """Whether ``block`` is in the free queue (the queue's fake head and tail give every
    queued block both links; a block out of it has neither) and carries a hash."""
    return block.prev_free_block is not None and block.block_hash is not None


def _hashed(blocks: Iterable[Any]) -> int:
    return sum(1 for b in blocks if b.block_hash is not None)


class CachedFreeCounter:
    """The number of free blocks of one vLLM ``BlockPool`` that carry a prefix-cache hash
    (``count``; ``None`` once counting failed), and of blocks in use (``in_use``). Build it
    with :meth:`attach`. Its wrappers never raise into vLLM: a failure of the count (a block
    shaped otherwise in another vLLM) stops counting, says why in ``error``, and leaves the
    wrapped methods doing what they did."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.count: int | None = self.walk()
        self.error: str | None = None

    def _failed(self, exc: Exception) -> None:
        self.count, self.error = None, f"{type(exc).__name__}: {exc}"

    @classmethod
    def attach(cls, pool: Any) -> CachedFreeCounter | None:
        """Count ``pool``'s cached-free blocks from now on; ``None`` (nothing wrapped) when
        the pool lacks a method the count needs (another vLLM version)."""
        queue = getattr(pool, "free_block_queue", None)
        names = [(queue, n) for n in QUEUE_IN + QUEUE_OUT] + [(pool, n) for n in HASH_CHANGES]
        if queue is None or not all(callable(getattr(o, n, None)) for o, n in names):
            return None
        if not callable(getattr(pool, "reset_prefix_cache", None)):
            return None
        counter = cls(pool)
        for name in QUEUE_IN:
            counter._wrap(queue, name, counter._entered)
        for name in QUEUE_OUT:
            counter._wrap(queue, name, counter._left)
        for name in HASH_CHANGES:
            counter._wrap_hash_change(pool, name)
        reset = pool.reset_prefix_cache

        @functools.wraps(reset)
        def reset_prefix_cache(*args: Any, **kwargs: Any) -> Any:
            done = reset(*args, **kwargs)
            if counter.count is not None:
                try:
                    counter.count = counter.walk()  # rare; vLLM walks every block here itself
                except Exception as exc:  # noqa: BLE001
                    counter._failed(exc)
            return done

        pool.reset_prefix_cache = reset_prefix_cache
        return counter

    @property
    def in_use(self) -> int:
        """Blocks held by requests: the pool less its null block less the free queue."""
        return int(self.pool.num_gpu_blocks) - 1 - int(self.pool.get_num_free_blocks())

    def walk(self) -> int:
        """The count by walking the free queue: O(free blocks)."""
        queue = self.pool.free_block_queue
        block, tail, n = queue.fake_free_list_head.next_free_block, queue.fake_free_list_tail, 0
        while block is not None and block is not tail:
            n += block.block_hash is not None
            block = block.next_free_block
        return n

    # -- the wrappers ---------------------------------------------------------------------

    def _entered(self, args: tuple[Any, ...], result: Any) -> int:
        blocks = args[0]
        return _hashed(blocks) if isinstance(blocks, list) else _hashed((blocks,))

    def _left(self, args: tuple[Any, ...], result: Any) -> int:
        if isinstance(result, list):  # popleft_n
            return -_hashed(result)
        return -_hashed((result if result is not None else args[0],))  # popleft, remove(block)

    def _wrap(self, owner: Any, name: str, change: Callable[[tuple[Any, ...], Any], int]) -> None:
        method = getattr(owner, name)
        counter = self

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            if counter.count is not None:
                try:
                    counter.count += change(args or tuple(kwargs.values()), result)
                except Exception as exc:  # noqa: BLE001 - never into vLLM's allocation path
                    counter._failed(exc)
            return result

        setattr(owner, name, wrapped)

    def _wrap_hash_change(self, pool: Any, name: str) -> None:
        """Wrap a pool method that gives a block a hash (``_insert_block_hash(hash, block,
        ...)``) or takes its hashes away (``_remove_cached_block_hashes(block)``): a queued
        block that gains its first hash or loses its last moves the count."""
        method = getattr(pool, name)
        index = 1 if name == "_insert_block_hash" else 0
        counter = self

        @functools.wraps(method)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            block = kwargs.get("block", args[index] if len(args) > index else None)
            before = False
            try:
                before = block is not None and _cached_free(block)
            except Exception as exc:  # noqa: BLE001 - never into vLLM's allocation path
                counter._failed(exc)
            result = method(*args, **kwargs)
            if block is not None and counter.count is not None:
                try:
                    counter.count += _cached_free(block) - before
                except Exception as exc:  # noqa: BLE001
                    counter._failed(exc)
            return result

        setattr(pool, name, wrapped)
