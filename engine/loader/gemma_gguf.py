"""Convert a Gemma 3 GGUF file (any quantization) into a Hugging Face gemma3_text folder.

llama.cpp stores Gemma's norm weights as (1 + w); the folder holds w, as transformers' GGUF loader
writes it (Gemma2TensorProcessor). q/k rows are not permuted for Gemma (NeoX-style rope)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import torch
from safetensors.torch import save_file
from tqdm import tqdm

from engine.loader.gguf_convert import _f32, _fields, hf_tensor_name

_TENSOR_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_FULL_EVERY = 6  # llama.cpp's Gemma 3: every sixth layer full attention (not in the metadata)
_LOCAL_ROPE_BASE = 10_000.0  # llama.cpp's Gemma 3 sliding-layer rope base (not in the metadata)


def gemma_hf_config(meta: dict[str, Any]) -> dict[str, Any]:
    arch = meta["general.architecture"]
    if arch != "gemma3":
        raise ValueError(f"not a Gemma 3 GGUF file (architecture {arch!r})")

    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"gemma3.{key}", default)

    layers, heads = int(get("block_count")), int(get("attention.head_count"))
    head_dim = int(get("attention.key_length"))
    scaling = None
    if get("rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": _f32(get("rope.scaling.factor"))}
    return {
        "architectures": ["Gemma3ForCausalLM"],
        "model_type": "gemma3_text",
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": int(get("embedding_length")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": int(get("context_length")),
        "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(get("rope.freq_base", 1_000_000.0)),
        "rope_local_base_freq": _LOCAL_ROPE_BASE,
        "rope_scaling": scaling,
        "sliding_window": int(get("attention.sliding_window")),
        "layer_types": [
            "full_attention" if (i + 1) % _FULL_EVERY == 0 else "sliding_attention"
            for i in range(layers)
        ],
        "query_pre_attn_scalar": head_dim,  # llama.cpp: 1/sqrt(head_dim) (all but the 27B)
        "final_logit_softcapping": get("final_logit_softcapping"),
        "attn_logit_softcapping": get("attn_logit_softcapping"),
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
        "torch_dtype": "float32",
    }


def gemma_weights(reader: gguf.GGUFReader, progress: bool) -> dict[str, torch.Tensor]:
    if any(t.name == "output.weight" for t in reader.tensors):
        raise ValueError("a Gemma 3 GGUF file with an untied output.weight is not supported")
    out = {}
    for t in tqdm(reader.tensors, desc="dequantizing", unit="tensor", disable=not progress):
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if t.name.endswith("norm.weight"):
            w = w - np.float32(1.0)
        out[hf_tensor_name(t.name, _TENSOR_NAMES)] = torch.from_numpy(np.ascontiguousarray(w))
    return out


def save_gemma_tokenizer(gguf_path: Path, out_dir: Path) -> None:
    """tokenizer.json and tokenizer_config.json of the GGUF's SentencePiece vocabulary, through
    transformers' GGUF tokenizer converter (the reference the tests hold it to)."""
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    tok.save_pretrained(out_dir)


def convert_gemma_gguf(gguf_path: str | Path, out_dir: str | Path, progress: bool = True) -> Path:
    """Write config.json, generation_config.json, model.safetensors (float32), tokenizer.json
    and tokenizer_config.json for a Gemma 3 GGUF file into out_dir."""
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    reader = gguf.GGUFReader(str(gguf_path))
    config = gemma_hf_config(_fields(reader))
    save_file(gemma_weights(reader, progress), str(out_dir / "model.safetensors"), {"format": "pt"})
    save_gemma_tokenizer(gguf_path, out_dir)
    generation = {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}
    for name, data in (("config.json", config), ("generation_config.json", generation)):
        (out_dir / name).write_text(json.dumps(data, indent=2) + "\n")
    return out_dir
