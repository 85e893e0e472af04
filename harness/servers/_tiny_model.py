"""A tiny random-weight Llama model and a locally trained tokenizer, made without network access.

No model can be downloaded on the machines this project runs on (see DESIGN.md), yet the
experiments need a real vLLM server. `make_tiny_model` writes a Hugging Face model folder
that vLLM's CPU backend serves: a 2-layer, 128-wide Llama with head_dim 64 (the CPU
attention kernels reject smaller head sizes such as 16) and random weights, plus a byte-level BPE
tokenizer trained here on a corpus generated from the seed, with a chat template so both
`/v1/completions` and `/v1/chat/completions` work. The text it generates is gibberish; only
its timing and token counts matter. The weights keep special tokens (EOS included) out of
sampling, so every generated token is a streamed chunk with non-empty text and every request
runs to ``max_tokens``, with or without ``ignore_eos``.

The same seed gives byte-identical files (for a given torch and tokenizers version).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

__all__ = ["make_tiny_model"]

HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 2
NUM_KV_HEADS = 2
HEAD_DIM = HIDDEN_SIZE // NUM_HEADS  # 64
MAX_POSITIONS = 8192
TARGET_VOCAB_SIZE = 2048
NUM_SENTENCES = 4000
DTYPE = torch.bfloat16
INIT_STD = 0.02
SPECIAL_LOGIT_WEIGHT = 2.0

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
SPECIAL_TOKENS = (BOS, EOS, UNK, *ROLE_TOKENS)  # the BPE trainer gives them ids 0..5
BOS_ID, EOS_ID = 0, 1

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

_WORDS = """
the a an one two three some many every no this that these those my your our their
time day night year week moment hour minute second morning evening city river road house
window door garden table letter story question answer number system network server client
packet stream buffer token model engine cache block queue socket request response signal
light water stone paper music voice market ship train bridge tower field forest mountain
island winter summer autumn spring machine engineer teacher doctor farmer writer student
is was will can could should would might must has had does did makes takes gives keeps
reads writes sends waits holds drops opens closes starts stops moves turns finds brings
runs walks builds breaks fills drains grows falls rises carries follows leaves returns
quick slow quiet loud bright dark small large old new early late simple strange careful
open empty full warm cold heavy light green blue red white black long short high low
and but or so because while when after before until if then also again never always
in on at by for with from into over under through between behind near across toward
""".split()


def make_tiny_model(out_dir: str | Path, *, seed: int = 0) -> Path:
    """Write a tiny random-weight Llama model folder that vLLM's CPU backend can serve.

    Files written into ``out_dir`` (created if missing; existing files are overwritten):

    - ``config.json``: ``LlamaForCausalLM``, hidden_size 128, 2 layers, 2 attention heads and
      2 KV heads of head_dim 64, intermediate_size 256, max_position_embeddings 8192,
      vocab_size equal to the tokenizer's (about 1,150 to 1,200), bfloat16, untied embeddings.
    - ``model.safetensors``: bfloat16 weights drawn from N(0, 0.02²) with a torch generator
      seeded with ``seed`` (RMSNorm weights are 1), with shapes embed_tokens and lm_head
      ``[vocab, 128]``, q/k/v/o_proj ``[128, 128]``, gate/up_proj ``[256, 128]``, down_proj
      ``[128, 256]``. Column 0 of embed_tokens is 1 and column 0 of the special tokens'
      lm_head rows is -2, which puts their probability below 1e-6 at every position.
    - ``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``: a
      byte-level BPE fast tokenizer trained on a corpus of ``NUM_SENTENCES`` sentences drawn
      from a fixed word list with ``random.Random(seed)``. Its base alphabet is printable
      ASCII plus tab and newline, so every non-special token decodes to non-empty ASCII text;
      other characters encode as ``<unk>``. Special tokens: ``<s>`` (BOS, added in front when
      ``add_special_tokens`` is true), ``</s>`` (EOS), ``<unk>``, and the chat role markers
      ``<|system|>``, ``<|user|>``, ``<|assistant|>``. The chat template renders
      ``<s><|user|>\\n{content}\\n...<|assistant|>\\n``.
    - ``generation_config.json``: BOS and EOS token ids only.

    The same ``seed`` gives byte-identical files; a different seed gives different weights
    and a different tokenizer. Returns ``out_dir`` as a ``Path``.

    Raises ``ValueError`` if ``seed`` is negative, ``OSError`` if ``out_dir`` cannot be
    created or written, and ``RuntimeError`` if the installed ``tokenizers`` does not give the
    special tokens ids 0 to 5.
    """
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = _train_tokenizer(seed)
    tokenizer.save(str(out / "tokenizer.json"))
    vocab_size = tokenizer.get_vocab_size()

    save_file(_random_weights(vocab_size, seed), str(out / "model.safetensors"), {"format": "pt"})
    _write_json(out / "config.json", _config(vocab_size))
    _write_json(out / "generation_config.json", {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID})
    special_map = {"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}
    _write_json(out / "special_tokens_map.json", special_map)
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            **special_map,
            "additional_special_tokens": list(ROLE_TOKENS),
            "model_max_length": MAX_POSITIONS,
            "clean_up_tokenization_spaces": False,
            "chat_template": CHAT_TEMPLATE,
        },
    )
    return out


def _corpus(seed: int) -> list[str]:
    """Sentences of 3 to 14 words from `_WORDS`, some with numbers, chosen by `seed`."""
    rng = random.Random(seed)
    words = _WORDS[:]
    rng.shuffle(words)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]  # Zipf-like frequencies
    lines = []
    for _ in range(NUM_SENTENCES):
        sentence = rng.choices(words, weights, k=rng.randint(3, 14))
        if rng.random() < 0.3:
            sentence.insert(rng.randrange(len(sentence)), str(rng.randrange(10_000)))
        text = " ".join(sentence)
        lines.append(text[0].upper() + text[1:] + rng.choice(".!?,;:"))
    return lines


def _train_tokenizer(seed: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    ascii_chars = "\t\n" + "".join(chr(b) for b in range(0x20, 0x7F))
    splitter = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    ((alphabet, _),) = splitter.pre_tokenize_str(ascii_chars)
    trainer = trainers.BpeTrainer(
        vocab_size=TARGET_VOCAB_SIZE,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=list(alphabet),
        limit_alphabet=len(alphabet),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(seed), trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, BOS_ID)],
    )
    if [tokenizer.token_to_id(tok) for tok in SPECIAL_TOKENS] != list(range(len(SPECIAL_TOKENS))):
        raise RuntimeError("tokenizers did not give the special tokens the first ids")
    return tokenizer


def _random_weights(vocab_size: int, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def normal(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * INIT_STD

    h, i, q, kv = HIDDEN_SIZE, INTERMEDIATE_SIZE, NUM_HEADS * HEAD_DIM, NUM_KV_HEADS * HEAD_DIM
    weights = {"model.embed_tokens.weight": normal(vocab_size, h)}
    for layer in range(NUM_LAYERS):
        p = f"model.layers.{layer}."
        weights |= {
            p + "input_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": normal(q, h),
            p + "self_attn.k_proj.weight": normal(kv, h),
            p + "self_attn.v_proj.weight": normal(kv, h),
            p + "self_attn.o_proj.weight": normal(h, q),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "mlp.gate_proj.weight": normal(i, h),
            p + "mlp.up_proj.weight": normal(i, h),
            p + "mlp.down_proj.weight": normal(h, i),
        }
    weights["model.norm.weight"] = torch.ones(h)
    weights["lm_head.weight"] = normal(vocab_size, h)
    # Keep special tokens out of sampling: hidden dimension 0 carries a constant that
    # dominates the residual stream (so it is about +8 after the final RMSNorm), and the
    # special tokens' lm_head rows weigh it at -SPECIAL_LOGIT_WEIGHT, for logits near -16.
    weights["model.embed_tokens.weight"][:, 0] = 1.0
    weights["lm_head.weight"][: len(SPECIAL_TOKENS), 0] = -SPECIAL_LOGIT_WEIGHT
    return {name: w.to(DTYPE).contiguous() for name, w in weights.items()}


def _config(vocab_size: int) -> dict[str, Any]:
    dtype = str(DTYPE).removeprefix("torch.")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN_SIZE,
        "intermediate_size": INTERMEDIATE_SIZE,
        "num_hidden_layers": NUM_LAYERS,
        "num_attention_heads": NUM_HEADS,
        "num_key_value_heads": NUM_KV_HEADS,
        "head_dim": HEAD_DIM,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": vocab_size,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "initializer_range": INIT_STD,
        "torch_dtype": dtype,
        "use_cache": True,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
