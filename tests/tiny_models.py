"""Tiny random-weight HF folders (Llama, Qwen2, Qwen3; Mistral and Qwen2 with sliding windows)
with a byte-level tokenizer: the models of every engine, storage and API test."""

from __future__ import annotations

import json
from pathlib import Path

import torch

TINY_VOCAB = 320  # 256 byte tokens + 3 specials + unused ids
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EOS_ID = 258  # <|im_end|>
WINDOWS = {"mistral-swa": 8, "qwen2-swa": 12}  # the windowed tiny models' sliding windows
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _write_tokenizer(folder: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIALS)
    tok.save(str(folder / "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "bos_token": None, "chat_template": CHAT_TEMPLATE}
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
    _write_tokenizer(folder)
    return folder
