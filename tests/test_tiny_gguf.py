"""Tests for the tiny model as GGUF (`harness.servers._tiny_gguf`): the file read back with gguf's
reader, its determinism and errors, the CLI, and, where llama-cpp-python is installed, llama.cpp
loading it, tokenizing as the HF tokenizer does, generating, and computing the HF logits."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf import GGUFReader
from tokenizers import Tokenizer
from typer.testing import CliRunner

from harness.cli import app
from harness.servers._tiny_gguf import GGUF_NAME, write_gguf

REPO = Path(__file__).resolve().parents[1]
HF_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
SENTENCES = [
    "The city",
    "The quick engineer sends 42 packets to the server.",
    "Hello, world! Is 3.14 > 2? Yes; (maybe) not: 'quoted' \"double\"",
    "two  spaces   and three",
    "line one\nline two\n\nafter a blank line",
    "  leading spaces, trailing spaces  ",
    "tabs\tand\ttabs 1234567890 and 007",
    "don't can't we'll it's they've I'm",
]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of models/tiny, or a fresh tiny model when it has not been made."""
    out = tmp_path_factory.mktemp("hf") / "tiny"
    made = REPO / "models" / "tiny"
    if all((made / name).exists() for name in HF_FILES):
        shutil.copytree(made, out)
        return out
    pytest.importorskip("torch")
    from harness.servers._tiny_model import make_tiny_model

    return make_tiny_model(out, seed=0)


@pytest.fixture(scope="module")
def gguf_path(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(hf_dir, tmp_path_factory.mktemp("gguf") / GGUF_NAME)


@pytest.fixture(scope="module")
def reader(gguf_path: Path) -> GGUFReader:
    return GGUFReader(gguf_path)


def _field(reader: GGUFReader, key: str) -> Any:
    field = reader.get_field(key)
    assert field is not None, key
    return field.contents()


def _json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def test_metadata(reader: GGUFReader, hf_dir: Path) -> None:
    config = _json(hf_dir / "config.json")
    expected = {
        "general.architecture": "llama",
        "general.file_type": 0,
        "llama.context_length": config["max_position_embeddings"],
        "llama.embedding_length": 128,
        "llama.block_count": 2,
        "llama.feed_forward_length": 256,
        "llama.attention.head_count": 2,
        "llama.attention.head_count_kv": 2,
        "llama.rope.dimension_count": 64,
        "llama.vocab_size": config["vocab_size"],
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.unknown_token_id": 2,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": _json(hf_dir / "tokenizer_config.json")["chat_template"],
    }
    assert {key: _field(reader, key) for key in expected} == expected
    assert _field(reader, "llama.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    assert _field(reader, "llama.rope.freq_base") == 10000.0


def test_vocabulary(reader: GGUFReader, hf_dir: Path) -> None:
    tok = _json(hf_dir / "tokenizer.json")
    vocab = _json(hf_dir / "config.json")["vocab_size"]
    by_id = {idx: text for text, idx in tok["model"]["vocab"].items()}
    by_id |= {t["id"]: t["content"] for t in tok["added_tokens"]}
    tokens = _field(reader, "tokenizer.ggml.tokens")
    assert tokens == [by_id[i] for i in range(vocab)]
    assert tokens[:6] == ["<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>"]
    assert "Ġthe" in tokens and "Ċ" in tokens  # byte-level strings as in tokenizer.json
    types = _field(reader, "tokenizer.ggml.token_type")
    assert types[:6] == [3, 3, 2, 3, 3, 3] and set(types[6:]) == {1}
    merges = _field(reader, "tokenizer.ggml.merges")
    hf_merges = tok["model"]["merges"]
    assert merges == [m if isinstance(m, str) else " ".join(m) for m in hf_merges]


def test_tensors(reader: GGUFReader, hf_dir: Path) -> None:
    vocab = _json(hf_dir / "config.json")["vocab_size"]
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, 128)}
    shapes["output.weight"] = (vocab, 128)
    shapes["output_norm.weight"] = (128,)
    for n in range(2):
        for name, shape in {
            "attn_norm": (128,),
            "attn_q": (128, 128),
            "attn_k": (128, 128),
            "attn_v": (128, 128),
            "attn_output": (128, 128),
            "ffn_norm": (128,),
            "ffn_gate": (256, 128),
            "ffn_up": (256, 128),
            "ffn_down": (128, 256),
        }.items():
            shapes[f"blk.{n}.{name}.weight"] = shape
    got = {t.name: tuple(int(d) for d in t.data.shape) for t in reader.tensors}
    assert got == shapes
    # GGML order (innermost dimension first) in the file's tensor info
    assert {t.name: tuple(int(d) for d in t.shape) for t in reader.tensors} == {
        name: shape[::-1] for name, shape in shapes.items()
    }
    assert {t.tensor_type.name for t in reader.tensors} == {"F32"}


def test_tensor_values_and_rotary_permutation(reader: GGUFReader, hf_dir: Path) -> None:
    pytest.importorskip("torch")
    from safetensors.torch import load_file

    hf = {k: v.float().numpy() for k, v in load_file(str(hf_dir / "model.safetensors")).items()}
    t = {tensor.name: np.asarray(tensor.data) for tensor in reader.tensors}
    np.testing.assert_array_equal(t["token_embd.weight"], hf["model.embed_tokens.weight"])
    np.testing.assert_array_equal(t["output.weight"], hf["lm_head.weight"])
    np.testing.assert_array_equal(
        t["blk.1.ffn_down.weight"], hf["model.layers.1.mlp.down_proj.weight"]
    )
    q_hf = hf["model.layers.0.self_attn.q_proj.weight"]
    q = t["blk.0.attn_q.weight"]
    assert not np.array_equal(q, q_hf)
    # GGML's row 2j / 2j+1 of a head is HF's row j / j + head_dim/2 of it
    for head in range(2):
        for j in range(32):
            np.testing.assert_array_equal(q[head * 64 + 2 * j], q_hf[head * 64 + j])
            np.testing.assert_array_equal(q[head * 64 + 2 * j + 1], q_hf[head * 64 + 32 + j])


def test_same_bytes_twice_and_merges_as_strings(
    hf_dir: Path, gguf_path: Path, tmp_path: Path
) -> None:
    again = write_gguf(hf_dir, tmp_path / "again" / "other-name.gguf")
    assert again.read_bytes() == gguf_path.read_bytes()
    assert not list(again.parent.glob("*.tmp"))
    # tokenizer.json from older tokenizers stores merges as "a b" strings: same file
    copy = tmp_path / "strings"
    shutil.copytree(hf_dir, copy)
    tok = _json(copy / "tokenizer.json")
    tok["model"]["merges"] = [
        m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]
    ]
    (copy / "tokenizer.json").write_text(json.dumps(tok), encoding="utf-8")
    assert write_gguf(copy, tmp_path / "s.gguf").read_bytes() == gguf_path.read_bytes()


def test_errors(hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_gguf(tmp_path / "missing", tmp_path / "x.gguf")
    bad = tmp_path / "bad"
    shutil.copytree(hf_dir, bad)
    config = _json(bad / "config.json")
    (bad / "config.json").write_text(json.dumps(config | {"model_type": "gpt2"}))
    with pytest.raises(ValueError, match=r"config\.json: field 'model_type'"):
        write_gguf(bad, tmp_path / "x.gguf")
    (bad / "config.json").write_text(
        json.dumps({k: v for k, v in config.items() if k != "hidden_size"})
    )
    with pytest.raises(ValueError, match=r"config\.json: missing field 'hidden_size'"):
        write_gguf(bad, tmp_path / "x.gguf")
    (bad / "config.json").write_text(json.dumps(config | {"intermediate_size": 512}))
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .*mlp.* has shape"):
        write_gguf(bad, tmp_path / "x.gguf")
    (bad / "config.json").write_text(json.dumps(config))
    (bad / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: missing field 'bos_token'"):
        write_gguf(bad, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


def test_cli_writes_gguf(hf_dir: Path, gguf_path: Path, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(hf_dir, folder)
    result = CliRunner().invoke(app, ["model", "tiny", str(folder), "--format", "gguf"])
    assert result.exit_code == 0, result.output
    assert result.output.strip() == str(folder / GGUF_NAME)
    assert (folder / GGUF_NAME).read_bytes() == gguf_path.read_bytes()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{}")
    result = CliRunner().invoke(app, ["model", "tiny", str(bad), "--format", "gguf"])
    assert result.exit_code == 2
    assert "field 'model_type'" in result.output


@pytest.fixture(scope="module")
def llm(gguf_path: Path) -> Iterator[Any]:
    llama_cpp = pytest.importorskip("llama_cpp")
    model = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=256, verbose=False, seed=0)
    yield model
    model.close()


@pytest.mark.parametrize("text", SENTENCES)
def test_llama_cpp_tokenizes_as_hf(llm: Any, hf_dir: Path, text: str) -> None:
    hf = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    expected = hf.encode(text).ids
    assert expected[0] == 0  # BOS in front
    assert llm.tokenize(text.encode(), add_bos=True) == expected
    assert llm.detokenize(expected[1:]).decode() == text


def test_llama_cpp_drops_characters_the_hf_tokenizer_maps_to_unk(llm: Any, hf_dir: Path) -> None:
    """A known difference: the vocabulary has byte tokens for printable ASCII, tab and newline
    only. For any other character (non-ASCII, carriage return) the HF tokenizer gives one
    ``<unk>`` per byte, while llama.cpp's BPE tokenizer, which has no unknown-token fallback,
    leaves it out."""
    hf = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    for text in ("caf\u00e9 na\u00efve", "x\r\ny"):
        expected = hf.encode(text).ids
        assert 2 in expected
        assert llm.tokenize(text.encode(), add_bos=True) == [i for i in expected if i != 2]


def test_llama_cpp_special_tokens(llm: Any, hf_dir: Path) -> None:
    hf = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    text = "<|user|>\nhello there\n<|assistant|>\n"
    assert llm.tokenize(text.encode(), add_bos=True, special=True) == hf.encode(text).ids
    assert llm.token_bos() == 0 and llm.token_eos() == 1


def test_llama_cpp_generates(llm: Any) -> None:
    out = llm("The city", max_tokens=20, temperature=0.8, seed=0)
    assert out["usage"]["completion_tokens"] == 20
    assert out["choices"][0]["finish_reason"] == "length"
    assert out["choices"][0]["text"].strip()


def test_llama_cpp_logits_match_transformers(gguf_path: Path, hf_dir: Path) -> None:
    """The permutation of q and k is right: llama.cpp computes the logits transformers does."""
    llama_cpp = pytest.importorskip("llama_cpp")
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    ids = Tokenizer.from_file(str(hf_dir / "tokenizer.json")).encode(SENTENCES[1]).ids
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0].numpy()
    llm = llama_cpp.Llama(model_path=str(gguf_path), n_ctx=256, verbose=False, logits_all=True)
    try:
        llm.eval(ids)
        got = np.asarray(llm.scores[: len(ids)])
    finally:
        llm.close()
    np.testing.assert_allclose(got, expected, atol=2e-3, rtol=0)
