"""Which decoder layers attend through a sliding window, and with which rope, read the way
transformers reads each config family.

A window W means: the query at position p attends the keys at positions [max(0, p - W + 1), p]
(transformers' sliding mask, kv_idx > q_idx - W). None: full causal attention.
"""

from __future__ import annotations

from typing import Any

SLIDING, FULL = "sliding_attention", "full_attention"
_DEFAULT_WINDOW = {"gemma3_text": 4096}  # transformers' default where config.json has none


def layer_windows(raw: dict[str, Any]) -> tuple[int | None, ...]:
    """Each layer's window (None: full attention) for an HF config.json dict."""
    n = int(raw["num_hidden_layers"])
    model_type = raw.get("model_type", "llama")
    window = raw.get("sliding_window", _DEFAULT_WINDOW.get(model_type))
    if model_type in ("qwen2", "qwen3") and not raw.get("use_sliding_window"):
        window = None  # Qwen2Config / Qwen3Config drop the window unless use_sliding_window
    if model_type == "gemma3_text" and raw.get("use_bidirectional_attention"):
        raise ValueError("gemma3_text with use_bidirectional_attention is not a causal LM")
    if window is None or model_type not in ("mistral", "qwen2", "qwen3", "gemma3_text"):
        return (None,) * n  # Llama reads no window: full attention in transformers too
    if int(window) < 1:
        raise ValueError(f"sliding_window must be at least 1, got {window}")
    types = _layer_types(raw, model_type, n)
    return tuple(int(window) if t == SLIDING else None for t in types)


def _layer_types(raw: dict[str, Any], model_type: str, n: int) -> tuple[str, ...]:
    if model_type == "mistral":  # MistralModel masks every layer by the window (no layer_types)
        return (SLIDING,) * n
    types = raw.get("layer_types")
    if types is not None:
        if len(types) != n or any(t not in (SLIDING, FULL) for t in types):
            raise ValueError(f"layer_types must be {n} of {SLIDING!r} / {FULL!r}, got {types}")
        return tuple(types)
    if model_type == "gemma3_text":  # every pattern-th layer is global
        pattern = int(raw.get("sliding_window_pattern") or raw.get("_sliding_window_pattern") or 6)
        return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(n))
    # Qwen2 / Qwen3: the layers from max_window_layers on are windowed
    first = int(raw.get("max_window_layers", 28))
    return tuple(SLIDING if i >= first else FULL for i in range(n))


def rope_parameters(raw: dict[str, Any], layer_type: str) -> dict[str, Any]:
    """The rope parameters of a layer type: configs with per-layer-type ropes (Gemma 3 in
    transformers 5) nest them under "full_attention" / "sliding_attention"."""
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if isinstance(params.get(FULL), dict) or isinstance(params.get(SLIDING), dict):
        return dict(params.get(layer_type) or {})
    return dict(params) if layer_type == FULL else {}


def has_local_rope(raw: dict[str, Any]) -> bool:
    """Whether windowed layers rotate with a rope of their own (Gemma 3's rope_local_base_freq)."""
    params = raw.get("rope_parameters") or {}
    return (
        isinstance(params.get(SLIDING), dict)
        or "rope_local_base_freq" in raw
        or raw.get("model_type") == "gemma3_text"
    )
