"""Continuous-batching scheduler of the engine emulator: pure, synchronous, clock-free.

One engine step is split in two calls so that the caller owns time: ``schedule()`` picks the
batch (allocating KV blocks, preempting when they run out, admitting waiting requests) and
says how long the step takes; ``complete(step, now)`` samples one token for every
scheduled sequence, finishes requests and releases KV according to ``kv_release``. The
asyncio driver sleeps between the two; tests drive the two calls with a fake clock.

Policy, following vLLM v1's ``Scheduler.schedule()`` (``vllm/v1/core/sched/scheduler.py``,
FCFS policy):

- running requests are scheduled first, in admission order, one new token each (a request
  just admitted or resumed computes its whole prompt + already generated tokens instead);
- when a running request cannot get the blocks for its next token, the most recently
  admitted running request (``running[-1]``) is preempted: its blocks are freed, its
  computed tokens reset to 0 and it goes back to the *front* of the waiting queue, to
  recompute prompt + generated tokens when resumed (recompute preemption); if the victim
  is the request being scheduled, it is not scheduled this step;
- waiting requests are admitted, front first, only if no preemption happened in this step,
  while ``len(running) < max_num_seqs``, the step's token budget allows
  (``max_num_batched_tokens``) and their blocks are free; the first one that does not
  fit stops admission (no skipping ahead).

A request's KV slots equal its computed tokens: the token sampled in a step is computed
(and needs a slot) in the next one, as in vLLM.

Prefix caching (``enable_prefix_caching``, vLLM v1's automatic prefix caching): a request
whose ``prompt_tokens`` are known hashes its full blocks (prompt, then generated tokens as
words), and an admitted request starts with the longest cached prefix of them
(``BlockManager``): those tokens are not computed (nor costed) again. ``prompt_cached_tokens``
records that count at its first admission, as vLLM's ``PrefillStats`` does (not after a
preemption); it is 0 with prefix caching off.

Each request keeps the record of its KV life that the engine tables need (``_recorder``):
when it was preempted and resumed, the most blocks it held, and when and how many blocks were
freed for good; times are whatever clock the caller passes in.
"""

from __future__ import annotations

import enum
import random
from collections import deque
from dataclasses import dataclass, field

from harness._sim._blocks import BlockManager, extend_block_hashes
from harness._sim._config import SimConfig

VOCAB: tuple[str, ...] = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with",
    "be", "by", "on", "not", "he", "this", "are", "or", "his", "from", "at", "which",
    "but", "have", "an", "had", "they", "you", "were", "their", "one", "all", "we", "can",
    "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
    "no", "out", "up", "into", "than", "them", "only", "time", "some", "could", "these",
    "two", "may", "first", "then", "do", "any", "like", "my", "now", "over", "such", "our",
    "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
    "through", "back", "years", "where", "much", "your", "way", "well", "down", "should",
    "because", "each", "just", "those", "people", "how", "too", "little", "state", "good",
    "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here",
    "between", "both", "life", "being", "under", "never", "day", "same", "another",
    "know", "while", "last", "might", "us", "great",
)  # fmt: skip
"""Token texts: token id ``i < len(VOCAB)`` (128 words, ASCII letters only) is the word
``VOCAB[i]``, streamed with a leading space; ``EOS_TOKEN_ID`` has empty text."""

EOS_TOKEN_ID = len(VOCAB)
TOKEN_KEYS: tuple[str, ...] = (*VOCAB, "</s>")
"""What a generated token id is in a block's hash: its word, as the word in a later prompt."""


class Status(enum.Enum):
    """Where a request is in its life."""

    WAITING = "waiting"  # queued, never admitted or preempted (computed tokens = 0)
    RUNNING = "running"  # in the batch
    HELD = "held"  # generation over, KV blocks kept until delivery (on_delivery only)
    DONE = "done"  # generation over and KV blocks released


@dataclass(eq=False, slots=True)
class SimRequest:
    """One generation request as the scheduler sees it.

    ``prompt_len`` and ``max_tokens`` are in tokens; times are seconds on the caller's
    clock (``time.monotonic()`` in the server, a fake clock in tests). ``prompt_tokens``: the
    prompt's tokens (words, marks, template tokens: ``_protocol``), ``prompt_len`` of them, or
    empty when unknown (its blocks are then never cached); ``prompt_cached_tokens``: prompt
    tokens found in the prefix cache at its first admission (None until then).
    ``finish_reason`` is one of vLLM's ``stop``, ``length``, ``abort`` once finished.

    KV record: ``admitted_time`` is its first admission, ``resumed_times`` each admission
    after a preemption (``preempted_times``); ``kv_blocks_peak`` is the most blocks it held at
    once, as of its last free (blocks only grow between frees); ``kv_freed_time`` and
    ``kv_blocks_freed`` say when its blocks went back to the pool for good and how many it
    held then (0 for a request aborted while waiting); None until then.
    """

    request_id: str
    prompt_len: int
    max_tokens: int
    ignore_eos: bool = False
    min_tokens: int = 0
    seed: int = 0
    arrival_time: float = 0.0
    prompt_tokens: tuple[object, ...] = ()
    prompt_cached_tokens: int | None = None
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: Status = Status.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    admitted_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    preempted_times: list[float] = field(default_factory=list)
    resumed_times: list[float] = field(default_factory=list)
    kv_blocks_peak: int = 0
    kv_freed_time: float | None = None
    kv_blocks_freed: int | None = None
    _rng: random.Random | None = None
    _hashes: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        """Prompt + generated tokens."""
        return self.prompt_len + len(self.output_token_ids)

    def block_hashes(self, block_size: int) -> list[int]:
        """The chained hashes of its full blocks so far (prompt, then generated words:
        ``extend_block_hashes``); empty when its prompt tokens are unknown."""
        hashes = self._hashes
        start = len(hashes) * block_size
        if self.prompt_tokens and self.num_tokens - start >= block_size:
            tokens = [*self.prompt_tokens[start:], *(TOKEN_KEYS[t] for t in
                      self.output_token_ids[max(start - self.prompt_len, 0):])]  # fmt: skip
            extend_block_hashes(hashes, tokens, block_size, start)
        return hashes

    @property
    def finished(self) -> bool:
        """Whether generation is over (finished or aborted)."""
        return self.finish_reason is not None

    def sample(self, vocab_size: int, eos_probability: float) -> int:
        """Draw the next token id from this request's seeded generator.

        One uniform draw ``u``: EOS if ``u < eos_probability`` (and EOS is not ignored),
        else a word chosen uniformly from the rest of the unit interval.
        """
        rng = self._rng
        if rng is None:
            rng = self._rng = random.Random(self.seed)
        u = rng.random()
        early = len(self.output_token_ids) < self.min_tokens  # vLLM's min_tokens: no EOS yet
        if self.ignore_eos or early or eos_probability <= 0.0:
            return int(u * vocab_size)
        if u < eos_probability:
            return EOS_TOKEN_ID
        return min(
            int((u - eos_probability) / (1.0 - eos_probability) * vocab_size), vocab_size - 1
        )


@dataclass(slots=True)
class ScheduledStep:
    """The batch of one step: who computes how many tokens, and what it costs.

    ``duration_s`` follows the step time model of ``SimConfig``. ``prefix_cache_queries``
    and ``prefix_cache_hits``: tokens of the requests admitted for the first time and of
    their cached prefixes (vLLM's ``PrefixCacheStats``, vllm/v1/metrics/stats.py).
    """

    requests: list[SimRequest]
    num_prefill_tokens: int
    num_decode_seqs: int
    num_preempted: int
    duration_s: float
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0


@dataclass(slots=True)
class TokenOutput:
    """The new token of one request after a step (one token per sequence per step).

    ``inter_token_s``: seconds since the request's previous token (None for its first).
    ``finish_reason``: set if generation ended in this step.
    """

    request: SimRequest
    token_id: int
    finish_reason: str | None
    inter_token_s: float | None


class Scheduler:
    """Continuous batching over a ``BlockManager``; see the module docstring for the policy.

    ``kv_release`` decides what happens to a request's blocks when its generation ends:
    ``on_finish`` frees them at once; ``on_delivery`` keeps them (status ``HELD``) until
    the caller calls ``release(request_id)``.
    """

    def __init__(self, config: SimConfig, blocks: BlockManager | None = None) -> None:
        self.config = config
        self.blocks = blocks or BlockManager(
            block_size=config.block_size, num_blocks=config.num_blocks
        )
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.held: dict[str, SimRequest] = {}
        self.requests: dict[str, SimRequest] = {}  # every request not yet DONE
        self.num_preemptions_total = 0
        self._vocab_size = len(VOCAB)

    # -- requests in --------------------------------------------------------------------

    def add_request(self, request: SimRequest) -> None:
        """Queue a request at the back of the waiting queue.

        Raises ``ValueError`` if its id is in use or it could never fit in
        ``max_model_len`` (vLLM rejects such requests with HTTP 400 before the engine).
        """
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.prompt_len < 1 or request.max_tokens < 1:
            raise ValueError("prompt_len and max_tokens must be at least 1")
        if request.prompt_len + request.max_tokens > self.config.max_model_len:
            raise ValueError(
                f"prompt_len + max_tokens = {request.prompt_len + request.max_tokens} "
                f"exceeds max_model_len={self.config.max_model_len}"
            )
        request.status = Status.WAITING
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def abort(self, request_id: str, now: float) -> bool:
        """Abort a request still generating: free its blocks, finish it with ``abort``.

        Returns True if it was waiting or running (it is then DONE with finish reason
        ``abort``); False if it had already finished generating (a held request is not
        released by this, see ``release``) or is unknown.
        """
        request = self.requests.get(request_id)
        if request is None or request.finished:
            return False
        if request.status is Status.RUNNING:
            self.running.remove(request)
        else:
            self.waiting.remove(request)
        request.finish_reason = "abort"
        request.finished_time = now
        self._retire(request, now)
        return True

    def release(self, request_id: str, now: float = 0.0) -> bool:
        """Free the blocks of a HELD request (its response was delivered or abandoned) at
        time ``now``.

        Returns False, doing nothing, if the request is not held.
        """
        request = self.held.pop(request_id, None)
        if request is None:
            return False
        self._retire(request, now)
        return True

    def _free_blocks(self, request: SimRequest) -> int:
        """Return the request's blocks to the pool (if it holds any); how many it held."""
        if not self.blocks.holds(request.request_id):
            return 0
        n = self.blocks.free(request.request_id)
        if n > request.kv_blocks_peak:
            request.kv_blocks_peak = n
        return n

    def _retire(self, request: SimRequest, now: float) -> None:
        """Free the request's blocks for good at ``now``: it is DONE and forgotten."""
        request.kv_blocks_freed = self._free_blocks(request)
        request.kv_freed_time = now
        request.status = Status.DONE
        del self.requests[request.request_id]

    # -- one step -----------------------------------------------------------------------

    def has_work(self) -> bool:
        """Whether a step could schedule anything (some request waiting or running)."""
        return bool(self.running or self.waiting)

    def schedule(self, now: float = 0.0) -> ScheduledStep | None:
        """Pick the batch of a step starting at ``now``; None if nothing could be scheduled.

        Allocates the blocks of every scheduled request, preempts when blocks run out and
        admits waiting requests (module docstring). The returned step must be passed to
        ``complete`` before the next ``schedule``.
        """
        cfg = self.config
        blocks = self.blocks
        budget = cfg.max_num_batched_tokens
        scheduled: list[SimRequest] = []
        prefill_tokens = decode_seqs = preempted = queries = hits = 0
        bs = cfg.block_size if cfg.enable_prefix_caching else 0

        running = self.running
        i = 0
        while i < len(running):
            request = running[i]
            new_tokens = request.num_tokens - request.num_computed_tokens
            if new_tokens > budget and scheduled:
                break  # token budget spent; the rest of the batch waits for the next step
            hashes = request.block_hashes(bs) if bs else ()
            while not blocks.allocate(request.request_id, request.num_tokens, hashes):
                victim = running.pop()
                self._preempt(victim, now)
                preempted += 1
                if victim is request:
                    break
            if request.status is not Status.RUNNING:
                break  # the request itself was preempted: no one after it can run either
            scheduled.append(request)
            budget -= new_tokens
            if new_tokens == 1:
                decode_seqs += 1
            else:
                prefill_tokens += new_tokens
            i += 1

        if not preempted:
            waiting = self.waiting
            while waiting and len(running) < cfg.max_num_seqs:
                request = waiting[0]
                hashes = request.block_hashes(bs) if bs else ()
                cached = blocks.num_cached_tokens(hashes, request.num_tokens)
                new_tokens = request.num_tokens - cached  # computed from the cached prefix
                if new_tokens > budget and scheduled:
                    break
                if not blocks.allocate(request.request_id, request.num_tokens, hashes):
                    break
                waiting.popleft()
                request.status = Status.RUNNING
                request.num_computed_tokens = cached
                if request.admitted_time is None:
                    request.admitted_time = now
                    request.prompt_cached_tokens = cached
                    queries += request.num_tokens if bs else 0
                    hits += cached
                else:  # only a preemption sends an admitted request back to waiting
                    request.resumed_times.append(now)
                running.append(request)
                scheduled.append(request)
                budget -= new_tokens
                prefill_tokens += new_tokens

        if not scheduled:
            return None
        duration_ms = (
            cfg.step_fixed_ms
            + cfg.prefill_ms_per_token * prefill_tokens
            + cfg.decode_ms_per_seq * decode_seqs
        )
        return ScheduledStep(
            requests=scheduled,
            num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decode_seqs,
            num_preempted=preempted,
            duration_s=duration_ms / 1000.0,
            prefix_cache_queries=queries,
            prefix_cache_hits=hits,
        )

    def _preempt(self, request: SimRequest, now: float) -> None:
        self._free_blocks(request)
        request.preempted_times.append(now)
        request.status = Status.WAITING
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions_total += 1
        self.waiting.appendleft(request)

    def complete(self, step: ScheduledStep, now: float) -> list[TokenOutput]:
        """Finish a step at time ``now``: one new token per scheduled request still running.

        Requests aborted or preempted since ``schedule`` are skipped. A request reaching
        ``max_tokens`` finishes with ``length``, one sampling EOS with ``stop``; its blocks
        are freed (``on_finish``) or kept until ``release`` (``on_delivery``).
        """
        cfg = self.config
        vocab_size = self._vocab_size
        eos_p = cfg.eos_probability
        on_finish = cfg.kv_release == "on_finish"
        outputs: list[TokenOutput] = []
        finished_any = False
        running = Status.RUNNING
        for request in step.requests:
            if request.status is not running:
                continue
            out_ids = request.output_token_ids
            request.num_computed_tokens = request.prompt_len + len(out_ids)
            token = request.sample(vocab_size, eos_p)
            out_ids.append(token)
            last = request.last_token_time
            request.last_token_time = now
            if last is None:
                request.first_token_time = now
            reason: str | None = None
            if token == EOS_TOKEN_ID:
                reason = "stop"
            elif len(out_ids) >= request.max_tokens:
                reason = "length"
            if reason is not None:
                finished_any = True
                request.finish_reason = reason
                request.finished_time = now
                if on_finish:
                    self._retire(request, now)
                else:
                    request.status = Status.HELD
                    self.held[request.request_id] = request
            outputs.append(
                TokenOutput(request, token, reason, None if last is None else now - last)
            )
        if finished_any:
            self.running = [r for r in self.running if r.status is Status.RUNNING]
        return outputs

    # -- observation --------------------------------------------------------------------

    @property
    def num_running(self) -> int:
        """Requests in the batch (vLLM's ``num_requests_running``); held ones excluded."""
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        """Requests queued, including preempted ones (vLLM's ``num_requests_waiting``)."""
        return len(self.waiting)

    @property
    def num_held(self) -> int:
        """Requests whose generation ended but whose blocks wait for delivery."""
        return len(self.held)
