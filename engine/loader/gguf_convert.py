"""Convert a llama-architecture GGUF file (any quantization) into a Hugging Face folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, pre_tokenizers, processors
from tokenizers.models import BPE
from tqdm import tqdm

_CONTROL = 3  # gguf token_type of special (control) tokens
_USER_DEFINED = 4
_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def _f32(x: float) -> float:
    return float(
        f"{float(x):.7g}"
    )  # the shortest decimal of a float32 value (9.99999975e-06 -> 1e-05)


def hf_config(meta: dict[str, Any], tied: bool) -> dict[str, Any]:
    arch = meta["general.architecture"]
    if arch != "llama":
        raise ValueError(f"only llama-architecture GGUF files are supported, not {arch!r}")
    heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_attention_heads": heads,
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "head_dim": int(meta.get("llama.rope.dimension_count", hidden // heads)),
        "hidden_act": "silu",
        "max_position_embeddings": int(meta["llama.context_length"]),
        "rms_norm_eps": _f32(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert permute of q/k rows (interleaved -> rotate-half RoPE layout)."""
    return (
        w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def hf_tensor_name(gguf_name: str, names: dict[str, str] = _TENSOR_NAMES) -> str:
    """The Hugging Face name of a GGUF tensor (`names`: GGUF's tensor kinds to HF modules)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    return f"{names[parts[0]]}.{parts[1]}"


def convert_weights(
    reader: gguf.GGUFReader, config: dict[str, Any], progress: bool
) -> dict[str, torch.Tensor]:
    out = {}
    for t in tqdm(reader.tensors, desc="dequantizing", unit="tensor", disable=not progress):
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if ".attn_q." in t.name:
            w = unpermute_qk(w, config["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = unpermute_qk(w, config["num_key_value_heads"])
        out[hf_tensor_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def build_tokenizer(meta: dict[str, Any]) -> tuple[Tokenizer, dict[str, Any]]:
    """Byte-level BPE (tokenizer.ggml.model == gpt2) from the GGUF vocabulary and merges, plus a
    tokenizer_config.json with the chat template and special tokens."""
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError("only gpt2-style (byte-level BPE) GGUF tokenizers are supported")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types = list(meta.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    split = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if meta.get("tokenizer.ggml.pre") == "smollm":  # llama.cpp: "\p{N}" then the gpt2 regex
        split.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(split)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _CONTROL
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, k in zip(tokens, types, strict=True)
            if k == _USER_DEFINED
        ]
    )

    def name(key: str) -> str | None:
        idx = meta.get(f"tokenizer.ggml.{key}")
        return tokens[int(idx)] if idx is not None else None

    tok_config = {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": name("bos_token_id"),
        "eos_token": name("eos_token_id"),
        "unk_token": name("unknown_token_id"),
        "pad_token": name("padding_token_id"),
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
        "chat_template": meta.get("tokenizer.chat_template"),
        "model_max_length": int(meta.get("llama.context_length", 2048)),
    }
    return tok, tok_config


def convert_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write config.json, generation_config.json, model.safetensors (float32), tokenizer.json
    and tokenizer_config.json for a llama GGUF file into out_dir."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_path))
    meta = _fields(reader)
    tied = not any(t.name == "output.weight" for t in reader.tensors)
    config = hf_config(meta, tied)
    tensors = convert_weights(reader, config, progress)
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    tokenizer, tok_config = build_tokenizer(meta)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    eos = config["eos_token_id"]
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": eos}
    for name, data in (
        ("config.json", config),
        ("generation_config.json", generation),
        ("tokenizer_config.json", tok_config),
    ):
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")
    return out_dir
