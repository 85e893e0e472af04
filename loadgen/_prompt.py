"""Deterministic prompts of an approximate length in tokens.

Words come from a small list of common short English words; with BPE tokenizers each such
word preceded by a space is usually one token, so ``n`` words are roughly ``n`` tokens. The
same ``(n_words, seed)`` always gives the same text; different seeds almost always differ in
the first words, so prompts of different requests share no prefix worth a KV block (no
accidental prefix-cache hits).
"""

from __future__ import annotations

import random
import zlib

_WORDS = (
    "the of and to in is that it was for on are as with his they at be this from have or one "
    "had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like "
    "him into time has look two more write go see number no way could people my than first "
    "water been call who oil its now find long down day did get come made may part over new "
    "sound take only little work know place year live me back give most very after thing our "
    "just name good sentence man think say great where help through much before line right "
    "too mean old any same tell boy follow came want show also around form three small set"
).split()


def prompt_seed(*parts: object) -> int:
    """A stable 32-bit seed from any values (``str()`` of each), e.g. run seed, group, indices.

    Uses CRC-32, not ``hash()``, so it does not change between processes (PYTHONHASHSEED).
    """
    return zlib.crc32("\x1f".join(str(p) for p in parts).encode("utf-8"))


def build_prompt(n_words: int, seed: int) -> str:
    """Return ``n_words`` space-separated words chosen by ``random.Random(seed)``.

    ``n_words`` approximates the prompt length in tokens. Raises ``ValueError`` if
    ``n_words < 1``.
    """
    if n_words < 1:
        raise ValueError(f"n_words must be >= 1, got {n_words}")
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n_words))


def build_prefixed_prompt(
    blocks: tuple[int, ...], block_words: int, n_words: int, seed: int
) -> str:
    """A prompt of ``n_words`` words made of ``block_words``-word blocks, one per id of
    ``blocks`` (each block's words seeded by its id alone), then words seeded by ``seed``
    where the blocks end before ``n_words``: two prompts that begin with the same ids begin
    with the same text, as a trace's ``hash_ids`` say their requests did (a prefix cache can
    reuse it). Raises ``ValueError`` if ``n_words < 1`` or ``block_words < 1``."""
    if block_words < 1:
        raise ValueError(f"block_words must be >= 1, got {block_words}")
    words: list[str] = []
    for block in blocks:
        if len(words) >= n_words:
            break
        words += build_prompt(block_words, prompt_seed("block", block)).split()
    if len(words) < n_words:
        words += build_prompt(n_words - len(words), seed).split()
    return " ".join(words[:n_words])
