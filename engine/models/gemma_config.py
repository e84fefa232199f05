"""Gemma 3's config: its config.json brought to the flat fields ModelConfig reads, and the few
fields only the Gemma decoder uses (GemmaOptions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GEMMA_MODEL_TYPES = ("gemma3_text", "gemma3")


def flatten_gemma(raw: dict[str, Any]) -> dict[str, Any]:
    """A gemma3 / gemma3_text config.json as one gemma3_text dict (the text_config of a gemma3
    image-text config) with Gemma's defaults where ModelConfig's differ: tied embeddings, tanh
    GELU (hidden_activation). Windows and ropes per layer type: engine/models/layer_types.py."""
    if raw.get("model_type") == "gemma3":  # its text_config leaves out the defaults
        from transformers import Gemma3TextConfig

        text = {k: v for k, v in (raw.get("text_config") or {}).items() if k != "model_type"}
        raw = Gemma3TextConfig(**text).to_dict()
    flat = dict(raw)
    flat.setdefault("tie_word_embeddings", True)
    flat.setdefault("hidden_act", flat.get("hidden_activation", "gelu_pytorch_tanh"))
    return flat


@dataclass(frozen=True)
class GemmaOptions:
    query_pre_attn_scalar: float = 256.0  # attention scale: query_pre_attn_scalar ** -0.5
    final_logit_softcapping: float | None = None  # logits = cap * tanh(logits / cap)

    @staticmethod
    def from_hf(raw: dict[str, Any]) -> GemmaOptions:
        # attn_logit_softcapping: transformers' Gemma 3 keeps it but never applies it; neither do we
        cap = raw.get("final_logit_softcapping")
        return GemmaOptions(
            query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", 256)),
            final_logit_softcapping=float(cap) if cap else None,
        )
