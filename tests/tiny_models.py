"""Tiny random-weight HF folders (Llama, Qwen2, Qwen3; Mistral and Qwen2 with sliding windows;
Gemma 3 without a chat template) with a byte-level tokenizer: the models of every engine, storage
and API test."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

TINY_VOCAB = 320  # 256 byte tokens + 3 specials + unused ids
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 258  # <|im_end|>
WINDOWS = {"mistral-swa": 8, "qwen2-swa": 12}  # the windowed tiny models' sliding windows
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path, chat_template: bool = True) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None}
    if chat_template:
        config["chat_template"] = CHAT_TEMPLATE
    (folder / "tokenizer_config.json").write_text(json.dumps(config))


def make_tiny_model(folder: Path, arch: str, seed: int = 0) -> Path:
    """A 2-layer random-weight model of `arch` saved as safetensors: "llama" | "qwen2" | "qwen3",
    or with sliding windows: "mistral-swa" (both layers, window 8) | "qwen2-swa" (layer 1 only,
    window 12: use_sliding_window with max_window_layers 1)."""
    import transformers

    common = {
        "vocab_size": TINY_VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "eos_token_id": EOS_ID,
        "bos_token_id": None,
        "tie_word_embeddings": arch != "llama",
        "initializer_range": 0.2,  # large weights: peaked logits, no near-ties in greedy tests
    }
    configs = {
        "llama": lambda: transformers.LlamaConfig(**common, rope_theta=10000.0),
        "qwen2": lambda: transformers.Qwen2Config(**common, rope_theta=1e6),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=32, rope_theta=1e6),
        "mistral-swa": lambda: transformers.MistralConfig(
            **common, sliding_window=WINDOWS["mistral-swa"], rope_theta=1e4
        ),
        "qwen2-swa": lambda: transformers.Qwen2Config(
            **common,
            rope_theta=1e6,
            use_sliding_window=True,
            sliding_window=WINDOWS["qwen2-swa"],
            max_window_layers=1,
        ),
    }
    classes = {
        "llama": transformers.LlamaForCausalLM,
        "qwen2": transformers.Qwen2ForCausalLM,
        "qwen3": transformers.Qwen3ForCausalLM,
        "mistral-swa": transformers.MistralForCausalLM,
        "qwen2-swa": transformers.Qwen2ForCausalLM,
    }
    torch.manual_seed(seed)
    model = classes[arch](configs[arch]()).eval()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    return folder


GEMMA_CONFIGS = {
    "d32-mixed": dict(  # full layers between sliding ones, scaled global rope, softcapped logits
        num_hidden_layers=5,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"]
        + ["full_attention", "sliding_attention"],
        head_dim=32,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=8,
        query_pre_attn_scalar=24,
        rope_local_base_freq=100.0,
        rope_theta=1e4,
        rope_scaling={"rope_type": "linear", "factor": 2.0},
        final_logit_softcapping=30.0,
    ),
    "d256-pattern": dict(  # Gemma 3 270M's shape: head dim 256, one KV head, every sixth full
        num_hidden_layers=6,
        head_dim=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        sliding_window=16,
        query_pre_attn_scalar=256,
    ),
}


def tiny_gemma_config(name: str) -> Any:
    import transformers

    return transformers.Gemma3TextConfig(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=96,
        max_position_embeddings=512,
        eos_token_id=EOS_ID,
        **GEMMA_CONFIGS[name],
    )


def randomize_gemma(model: torch.nn.Module) -> None:
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if "norm" in name else 0.15))


def make_tiny_gemma(folder: Path, name: str) -> tuple[Any, Path]:
    """(transformers' model, its folder) of GEMMA_CONFIGS[name]: norm weights around 0 (the
    forward multiplies by 1 + w), projections large enough for peaked logits (no near-ties in
    greedy runs); a base model's tokenizer (no chat template)."""
    import transformers

    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(tiny_gemma_config(name)).eval()
    randomize_gemma(hf)
    folder.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(folder)
    write_tokenizer(folder, chat_template=False)
    return hf, folder
