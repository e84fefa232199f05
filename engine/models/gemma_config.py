"""Gemma 3's config: its config.json brought to the flat fields ModelConfig reads, and the few
fields only the Gemma decoder uses (GemmaOptions)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GEMMA_MODEL_TYPES = ("gemma3_text", "gemma3")
_PATTERN = 6  # Gemma 3's default: every sixth layer full attention, the others sliding


def flatten_gemma(raw: dict[str, Any]) -> dict[str, Any]:
    """A gemma3 / gemma3_text config.json as one flat gemma3_text dict: the text_config of a
    gemma3 (multimodal) config, transformers 5's per-layer-type rope_parameters as rope_theta /
    rope_scaling (full layers) and rope_local_base_freq (sliding layers), and layer_types
    spelled out where only the old sliding_window_pattern is given."""
    if raw.get("model_type") == "gemma3":  # its text_config leaves out the defaults
        from transformers import Gemma3TextConfig

        text = {k: v for k, v in (raw.get("text_config") or {}).items() if k != "model_type"}
        raw = Gemma3TextConfig(**text).to_dict()
    if raw.get("use_bidirectional_attention"):
        raise ValueError("bidirectional Gemma 3 (an embedding model) is not a decoder to serve")
    flat = dict(raw)
    params = flat.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported sliding-layer rope_type {local['rope_type']!r}")
        flat.pop("rope_parameters")
        flat["rope_theta"] = full.pop("rope_theta", 1_000_000.0)
        flat["rope_scaling"] = full if full.get("rope_type", "default") != "default" else None
        flat["rope_local_base_freq"] = local.get("rope_theta", 10_000.0)
    flat.setdefault("rope_theta", 1_000_000.0)
    flat.setdefault("rope_local_base_freq", 10_000.0)
    flat.setdefault("tie_word_embeddings", True)
    flat.setdefault("hidden_act", flat.get("hidden_activation", "gelu_pytorch_tanh"))
    if flat.get("layer_types") is None:
        pattern = int(
            flat.get("sliding_window_pattern") or flat.get("_sliding_window_pattern") or _PATTERN
        )
        flat["layer_types"] = [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
            for i in range(int(flat["num_hidden_layers"]))
        ]
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
