"""The tiny test model as one GGUF file, for llama.cpp engines (llama-cpp-python, llama-server).

`write_gguf` converts the Hugging Face folder that `harness.servers._tiny_model.make_tiny_model`
writes (a Llama with a byte-level BPE tokenizer) into a GGUF file with the PyPI ``gguf``
package's ``GGUFWriter``, without llama.cpp's converter script and without torch: the bf16
weights are read straight from ``model.safetensors`` with numpy and stored as float32.

The facts it follows come from llama.cpp: the metadata keys, tensor names and token types from
gguf-py's ``gguf/constants.py`` (``Keys``, ``MODEL_TENSOR``/``TENSOR_NAMES``, ``TokenType``), and
the rotary permutation of q and k, the GPT-2 style vocabulary (``tokenizer.ggml.model`` "gpt2",
tokens in id order, merges as "a b" strings) and the hyperparameters a Llama needs from
``convert_hf_to_gguf.py`` (``LlamaModel.permute``, ``LlamaModel.modify_tensors``,
``TextModel.set_gguf_parameters``, ``TextModel.get_vocab_base``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFWriter, LlamaFileType, TokenType

__all__ = ["GGUF_NAME", "write_gguf"]

GGUF_NAME = "tiny.gguf"  # the file name `zerowindow model tiny DIR --format gguf` writes in DIR

_ARCH = "llama"
_CONFIG, _WEIGHTS = "config.json", "model.safetensors"
_TOKENIZER, _TOKENIZER_CONFIG = "tokenizer.json", "tokenizer_config.json"
# safetensors dtype -> (numpy dtype of the stored little-endian values); BF16 is widened by hand
_SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "BF16": "<u2"}
# HF name after "model.layers.N." -> llama.cpp name after "blk.N." (gguf-py TENSOR_NAMES)
_LAYER_TENSORS = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def write_gguf(hf_dir: Path, out_path: Path) -> Path:
    """Convert the tiny Llama model folder ``hf_dir`` into the GGUF file ``out_path``.

    Reads ``config.json``, ``model.safetensors``, ``tokenizer.json`` and
    ``tokenizer_config.json`` from ``hf_dir`` (a folder as `make_tiny_model` writes it: a
    ``LlamaForCausalLM`` with untied or tied embeddings, no biases, no rope scaling, a BPE
    tokenizer with a byte-level pre-tokenizer) and writes one GGUF (version 3, little-endian)
    to ``out_path``, creating its parent folders; an existing file is replaced only once the
    new one is complete (it is written to ``out_path`` + ``.tmp`` first). Returns
    ``out_path``. The same folder gives byte-identical files. For the tiny model (hidden 128,
    2 layers, vocabulary of about 1,160 tokens) the file is about 2.5 MB.

    What is written:

    - Metadata ``general.architecture`` "llama", ``general.name`` (the folder's name) and
      ``general.file_type`` 0 (ALL_F32); ``llama.context_length`` (max_position_embeddings,
      tokens), ``llama.embedding_length`` (hidden_size), ``llama.block_count``
      (num_hidden_layers), ``llama.feed_forward_length`` (intermediate_size),
      ``llama.attention.head_count`` and ``.head_count_kv``, ``.key_length`` and
      ``.value_length`` (head_dim), ``.layer_norm_rms_epsilon`` (rms_norm_eps),
      ``llama.rope.freq_base`` (rope_theta), ``llama.rope.dimension_count`` (head_dim) and
      ``llama.vocab_size``.
    - Tokenizer: ``tokenizer.ggml.model`` "gpt2" and ``.pre`` "gpt-2"; ``.tokens``, one per id
      0..vocab_size-1, the byte-level strings of tokenizer.json's vocabulary and added tokens
      (ids no token has, up to config.json's vocab_size, become unused ``[PAD{id}]``);
      ``.token_type`` (1 normal, 2 for the ``unk_token``, 3 control for the other special added
      tokens, 4 user-defined for non-special added tokens, 5 unused); ``.merges`` as "a b"
      strings in rank order (tokenizer.json may store them as pairs or as strings);
      ``.bos_token_id``, ``.eos_token_id`` and ``.unk_token_id`` from tokenizer_config.json's
      tokens; ``.add_bos_token`` and ``.add_eos_token`` from tokenizer.json's
      ``TemplateProcessing`` post-processor (whether it puts BOS first / EOS last; without one,
      tokenizer_config.json's ``add_bos_token``/``add_eos_token``, default false); and
      ``tokenizer.chat_template`` when tokenizer_config.json has one.
    - Tensors, all float32 (bf16 and f16 weights are widened exactly), with the shapes in
      PyTorch order (rows = output features): ``token_embd.weight`` and ``output.weight``
      [vocab, hidden] (``output.weight`` is left out when the embeddings are tied and there is
      no lm_head), ``output_norm.weight`` [hidden], and per layer N ``blk.N.attn_norm.weight``
      and ``blk.N.ffn_norm.weight`` [hidden], ``blk.N.attn_q.weight`` [heads * head_dim,
      hidden], ``blk.N.attn_k.weight`` and ``blk.N.attn_v.weight`` [kv_heads * head_dim,
      hidden], ``blk.N.attn_output.weight`` [hidden, heads * head_dim],
      ``blk.N.ffn_gate.weight`` and ``blk.N.ffn_up.weight`` [intermediate, hidden] and
      ``blk.N.ffn_down.weight`` [hidden, intermediate]. q and k are permuted from HF's rotary
      layout (rotate halves) to GGML's (rotate adjacent pairs) as ``LlamaModel.permute`` does:
      reshape to (heads, 2, rows // heads // 2, hidden), swap axes 1 and 2, reshape back, with
      kv_heads for k.

    Raises ``ValueError``, naming the file and the field, when ``hf_dir`` is not such a model:
    a JSON file that does not parse or lacks a field, another architecture or model type,
    dimensions that do not fit together, a missing or misshapen tensor, a dtype other than
    F32/F16/BF16/F64, a tokenizer that is not byte-level BPE or whose special tokens are not in
    its vocabulary. Raises ``OSError`` (``FileNotFoundError`` for a missing file) when a file
    cannot be read or ``out_path`` cannot be written.
    """
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    config = _read_json(hf_dir / _CONFIG)
    hp = _hyperparameters(config, hf_dir / _CONFIG)
    tensors = _gguf_tensors(_read_safetensors(hf_dir / _WEIGHTS), hp, config, hf_dir / _WEIGHTS)
    vocab = _vocabulary(
        _read_json(hf_dir / _TOKENIZER), _read_json(hf_dir / _TOKENIZER_CONFIG), hf_dir, hp
    )

    writer = GGUFWriter(None, _ARCH)
    writer.add_file_type(LlamaFileType.ALL_F32)
    _add_hyperparameters(writer, hp)
    _add_tokenizer(writer, vocab)
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    try:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, out_path)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return out_path


def _add_hyperparameters(writer: GGUFWriter, hp: dict[str, Any]) -> None:
    """The ``llama.*`` metadata (see :func:`write_gguf`)."""
    writer.add_context_length(hp["context"])
    writer.add_embedding_length(hp["hidden"])
    writer.add_block_count(hp["layers"])
    writer.add_feed_forward_length(hp["ffn"])
    writer.add_head_count(hp["heads"])
    writer.add_head_count_kv(hp["kv_heads"])
    writer.add_key_length(hp["head_dim"])
    writer.add_value_length(hp["head_dim"])
    writer.add_layer_norm_rms_eps(hp["rms_eps"])
    writer.add_rope_freq_base(hp["rope_theta"])
    writer.add_rope_dimension_count(hp["head_dim"])
    writer.add_vocab_size(hp["vocab"])


def _add_tokenizer(writer: GGUFWriter, vocab: dict[str, Any]) -> None:
    """The ``tokenizer.*`` metadata (see :func:`write_gguf`)."""
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(vocab["tokens"])
    writer.add_token_types(vocab["types"])
    writer.add_token_merges(vocab["merges"])
    writer.add_bos_token_id(vocab["bos"])
    writer.add_eos_token_id(vocab["eos"])
    writer.add_unk_token_id(vocab["unk"])
    writer.add_add_bos_token(vocab["add_bos"])
    writer.add_add_eos_token(vocab["add_eos"])
    if vocab["chat_template"] is not None:
        writer.add_chat_template(vocab["chat_template"])


def _read_json(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], path: Path) -> Any:
    if key not in obj:
        raise ValueError(f"{path}: missing field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f"{path}: field {key!r} has an unexpected value {value!r}")
    return value


def _hyperparameters(config: dict[str, Any], path: Path) -> dict[str, Any]:
    if config.get("model_type") != "llama":
        raise ValueError(f"{path}: field 'model_type' is {config.get('model_type')!r}, not 'llama'")
    archs = config.get("architectures") or ["LlamaForCausalLM"]
    if archs != ["LlamaForCausalLM"]:
        raise ValueError(f"{path}: field 'architectures' is {archs!r}, not ['LlamaForCausalLM']")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            raise ValueError(f"{path}: field {key!r} is true; biases are not supported")
    if config.get("rope_scaling"):
        raise ValueError(f"{path}: field 'rope_scaling' is set; rope scaling is not supported")
    hp = {
        "hidden": _field(config, "hidden_size", int, path),
        "ffn": _field(config, "intermediate_size", int, path),
        "layers": _field(config, "num_hidden_layers", int, path),
        "heads": _field(config, "num_attention_heads", int, path),
        "context": _field(config, "max_position_embeddings", int, path),
        "vocab": _field(config, "vocab_size", int, path),
        "rms_eps": float(_field(config, "rms_norm_eps", (int, float), path)),
        "rope_theta": float(config.get("rope_theta", 10000.0)),
    }
    hp["kv_heads"] = config.get("num_key_value_heads", hp["heads"])
    hp["head_dim"] = config.get("head_dim") or hp["hidden"] // max(hp["heads"], 1)
    for key in ("hidden", "ffn", "layers", "heads", "context", "vocab"):
        if hp[key] <= 0:
            raise ValueError(f"{path}: a size field ({key}) is {hp[key]}, not positive")
    if not isinstance(hp["kv_heads"], int) or not 0 < hp["kv_heads"] <= hp["heads"]:
        raise ValueError(f"{path}: field 'num_key_value_heads' is {hp['kv_heads']!r}")
    if hp["heads"] % hp["kv_heads"]:
        raise ValueError(f"{path}: 'num_attention_heads' is not a multiple of the KV heads")
    if not isinstance(hp["head_dim"], int) or hp["head_dim"] <= 0 or hp["head_dim"] % 2:
        raise ValueError(f"{path}: field 'head_dim' is {hp['head_dim']!r}, not a positive even int")
    return hp


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as float32 arrays (format: an 8-byte little-endian
    header length, a JSON header naming dtype, shape and data_offsets, then the raw data)."""
    data = path.read_bytes()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (header_len,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8 : 8 + header_len])
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: the safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the safetensors header is not a JSON object")
    body = memoryview(data)[8 + header_len :]
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], list(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}: tensor {name!r}: malformed header entry {info!r}") from None
        if dtype not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: tensor {name!r} has dtype {dtype}, not F32/F16/BF16/F64")
        raw = np.frombuffer(body[begin:end], dtype=_SAFETENSORS_DTYPES[dtype])
        if raw.size != int(np.prod(shape)) or end > len(body):
            raise ValueError(f"{path}: tensor {name!r}: data_offsets do not fit shape {shape}")
        if dtype == "BF16":  # bfloat16 is the upper half of a float32
            values = (raw.astype("<u4") << 16).view("<f4")
        else:
            values = raw.astype("<f4")
        arrays[name] = values.reshape(shape)
    return arrays


def _permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """HF's rotary layout to GGML's (convert_hf_to_gguf.py, ``LlamaModel.permute``)."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def _gguf_tensors(
    hf: dict[str, np.ndarray], hp: dict[str, Any], config: dict[str, Any], path: Path
) -> dict[str, np.ndarray]:
    h, ffn, hd, vocab = hp["hidden"], hp["ffn"], hp["head_dim"], hp["vocab"]
    q, kv = hp["heads"] * hd, hp["kv_heads"] * hd
    expected: dict[str, tuple[str, tuple[int, ...]]] = {
        "model.embed_tokens.weight": ("token_embd.weight", (vocab, h)),
    }
    layer_shapes = {
        "input_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h),
        "self_attn.k_proj.weight": (kv, h),
        "self_attn.v_proj.weight": (kv, h),
        "self_attn.o_proj.weight": (h, q),
        "post_attention_layernorm.weight": (h,),
        "mlp.gate_proj.weight": (ffn, h),
        "mlp.up_proj.weight": (ffn, h),
        "mlp.down_proj.weight": (h, ffn),
    }
    for layer in range(hp["layers"]):
        for hf_suffix, shape in layer_shapes.items():
            gguf_name = f"blk.{layer}.{_LAYER_TENSORS[hf_suffix]}"
            expected[f"model.layers.{layer}.{hf_suffix}"] = (gguf_name, shape)
    expected["model.norm.weight"] = ("output_norm.weight", (h,))
    if "lm_head.weight" in hf or not config.get("tie_word_embeddings", False):
        expected["lm_head.weight"] = ("output.weight", (vocab, h))
    unknown = sorted(set(hf) - set(expected))
    if unknown:
        raise ValueError(f"{path}: tensors this converter does not know: {unknown[:5]}")
    out = {}
    for hf_name, (gguf_name, shape) in expected.items():
        if hf_name not in hf:
            raise ValueError(f"{path}: missing tensor {hf_name!r}")
        array = hf[hf_name]
        if array.shape != shape:
            raise ValueError(f"{path}: tensor {hf_name!r} has shape {array.shape}, not {shape}")
        if hf_name.endswith("q_proj.weight"):
            array = _permute(array, hp["heads"])
        elif hf_name.endswith("k_proj.weight"):
            array = _permute(array, hp["kv_heads"])
        out[gguf_name] = np.ascontiguousarray(array, dtype="<f4")
    return out


def _token_content(value: Any) -> str | None:
    """A special token in tokenizer_config.json: a string or an AddedToken dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _check_bpe(tok: dict[str, Any], tok_path: Path) -> dict[str, Any]:
    """The tokenizer's ``model``, once it is a byte-level BPE with the GPT-2 regex (what
    llama.cpp's ``gpt2`` tokenizer reads) and no normalizer. Raises ``ValueError``."""
    model = _field(tok, "model", dict, tok_path)
    if model.get("type") != "BPE":
        raise ValueError(f"{tok_path}: field 'model.type' is {model.get('type')!r}, not 'BPE'")
    pre = tok.get("pre_tokenizer") or {}
    if (
        pre.get("type") != "ByteLevel"
        or pre.get("add_prefix_space")
        or not pre.get("use_regex", True)
    ):
        raise ValueError(
            f"{tok_path}: field 'pre_tokenizer' is {pre!r}, not a ByteLevel pre-tokenizer with "
            "the GPT-2 regex and no prefix space"
        )
    if tok.get("normalizer"):
        raise ValueError(f"{tok_path}: field 'normalizer' is set; normalizers are not supported")
    return model


def _tokens_by_id(
    tok: dict[str, Any], model: dict[str, Any], tok_path: Path, vocab_size: int
) -> tuple[dict[int, str], set[int], set[int]]:
    """Each id's token (the vocabulary and the added tokens), and the ids of the special and
    of the other added tokens. Raises ``ValueError`` for a malformed or clashing entry, or an id
    beyond ``vocab_size``."""
    vocab = _field(model, "vocab", dict, tok_path)
    by_id: dict[int, str] = {idx: text for text, idx in vocab.items()}
    specials: set[int] = set()
    user_defined: set[int] = set()
    for entry in tok.get("added_tokens") or []:
        idx, text = entry.get("id"), entry.get("content")
        if not isinstance(idx, int) or not isinstance(text, str):
            raise ValueError(f"{tok_path}: field 'added_tokens' has a malformed entry {entry!r}")
        if by_id.get(idx, text) != text:
            raise ValueError(f"{tok_path}: added token {text!r} has the id of {by_id[idx]!r}")
        by_id[idx] = text
        (specials if entry.get("special") else user_defined).add(idx)
    if any(not 0 <= idx < vocab_size for idx in by_id):
        raise ValueError(
            f"{tok_path}: token ids reach {max(by_id)}, beyond config.json's vocab_size "
            f"{vocab_size}"
        )
    return by_id, specials, user_defined


def _merges(model: dict[str, Any], tok_path: Path) -> list[str]:
    """The merges as "a b" strings in rank order (stored as pairs or as strings)."""
    merges = []
    for merge in _field(model, "merges", list, tok_path):
        pair = merge.split(" ") if isinstance(merge, str) else merge
        if not (
            isinstance(pair, list) and len(pair) == 2 and all(isinstance(p, str) for p in pair)
        ):
            raise ValueError(f"{tok_path}: field 'model.merges' has a malformed merge {merge!r}")
        if any(" " in part for part in pair):
            raise ValueError(f"{tok_path}: merge {pair!r} has a space in a part")
        merges.append(" ".join(pair))
    return merges


def _token_type(idx: int, unk: int, specials: set[int], user_defined: set[int]) -> TokenType:
    if idx == unk:
        return TokenType.UNKNOWN
    if idx in specials:
        return TokenType.CONTROL
    return TokenType.USER_DEFINED if idx in user_defined else TokenType.NORMAL


def _vocabulary(
    tok: dict[str, Any], tok_config: dict[str, Any], hf_dir: Path, hp: dict[str, Any]
) -> dict[str, Any]:
    """The tokenizer as :func:`write_gguf` writes it: tokens, their types, merges, the
    special ids, whether BOS/EOS are added, the chat template. Raises ``ValueError``."""
    tok_path, cfg_path = hf_dir / _TOKENIZER, hf_dir / _TOKENIZER_CONFIG
    model = _check_bpe(tok, tok_path)
    vocab_size = hp["vocab"]
    by_id, specials, user_defined = _tokens_by_id(tok, model, tok_path, vocab_size)
    ids = {text: idx for idx, text in by_id.items()}

    def special_id(key: str) -> int:
        text = _token_content(tok_config.get(key))
        if text is None:
            raise ValueError(f"{cfg_path}: missing field {key!r}")
        if text not in ids:
            raise ValueError(f"{cfg_path}: field {key!r} is {text!r}, not in {_TOKENIZER}")
        return ids[text]

    bos, eos, unk = special_id("bos_token"), special_id("eos_token"), special_id("unk_token")
    tokens = [by_id.get(idx, f"[PAD{idx}]") for idx in range(vocab_size)]
    types = [
        _token_type(idx, unk, specials, user_defined) if idx in by_id else TokenType.UNUSED
        for idx in range(vocab_size)
    ]
    add_bos, add_eos = _adds_bos_eos(tok, tok_config, by_id, bos, eos)
    template = tok_config.get("chat_template")
    if template is not None and not isinstance(template, str):
        raise ValueError(f"{cfg_path}: field 'chat_template' is not a string")
    return {
        "tokens": tokens,
        "types": types,
        "merges": _merges(model, tok_path),
        "bos": bos,
        "eos": eos,
        "unk": unk,
        "add_bos": add_bos,
        "add_eos": add_eos,
        "chat_template": template,
    }


def _adds_bos_eos(
    tok: dict[str, Any], tok_config: dict[str, Any], by_id: dict[int, str], bos: int, eos: int
) -> tuple[bool, bool]:
    """Whether encoding puts BOS in front and EOS at the end of a single text."""
    post = tok.get("post_processor") or {}
    if post.get("type") == "TemplateProcessing" and post.get("single"):
        single = post["single"]

        def is_special(item: Any, idx: int) -> bool:
            return (
                isinstance(item, dict) and (item.get("SpecialToken") or {}).get("id") == by_id[idx]
            )

        return is_special(single[0], bos), is_special(single[-1], eos)
    return bool(tok_config.get("add_bos_token", False)), bool(
        tok_config.get("add_eos_token", False)
    )
