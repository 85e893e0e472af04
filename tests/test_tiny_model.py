"""Tests for the tiny random-weight model generator (no vLLM server needed)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors.torch import load_file  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from harness.servers._tiny_model import SPECIAL_TOKENS, make_tiny_model  # noqa: E402

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
}


def _hashes(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "seed0", seed=0)


def test_writes_expected_files(model_dir: Path) -> None:
    assert {p.name for p in model_dir.iterdir()} == EXPECTED_FILES


def test_same_seed_is_byte_identical_across_processes(model_dir: Path, tmp_path: Path) -> None:
    again = tmp_path / "again"
    code = (
        "from harness.servers._tiny_model import make_tiny_model; "
        f"make_tiny_model({str(again)!r})"
    )
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], check=True, cwd=root, timeout=120)
    assert _hashes(again) == _hashes(model_dir)


def test_different_seed_gives_different_weights(model_dir: Path, tmp_path: Path) -> None:
    other = make_tiny_model(tmp_path / "seed1", seed=1)
    a = load_file(str(model_dir / "model.safetensors"))
    b = load_file(str(other / "model.safetensors"))
    assert a.keys() == b.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert a[name].shape == b[name].shape == (128, 128)
    assert not (a[name] == b[name]).all()
    assert _hashes(other)["model.safetensors"] != _hashes(model_dir)["model.safetensors"]


def test_negative_seed_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="seed"):
        make_tiny_model(tmp_path, seed=-1)


def test_config_has_head_dim_64(model_dir: Path) -> None:
    config = AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "llama"
    assert config.head_dim == 64
    assert config.hidden_size // config.num_attention_heads == 64
    assert config.max_position_embeddings == 8192
    weights = load_file(str(model_dir / "model.safetensors"))
    assert weights["lm_head.weight"].shape == (config.vocab_size, 128)


def test_tokenizer_round_trips_text(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    assert len(tokenizer) == config.vocab_size
    assert 1000 <= len(tokenizer) <= 4096
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")
    text = "The quick server sends 1234 tokens to a slow client!\n\tDone? {yes}"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert len(ids) < len(text)  # BPE merges happened
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_chat_template_renders(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hello there"},
    ]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert rendered == "<s><|system|>\nBe brief.\n<|user|>\nHello there\n<|assistant|>\n"
    ids = tokenizer(rendered, add_special_tokens=False).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_tokens_to_ids("<|assistant|>") in ids


def test_special_tokens_are_never_sampled(model_dir: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 128), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        probs = model(ids).logits.softmax(-1)
    assert probs[..., : len(SPECIAL_TOKENS)].max().item() < 1e-6  # special tokens: ids 0..5
    assert probs.max().item() < 0.05  # the rest stays close to uniform: gibberish text
