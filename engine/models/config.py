"""ModelConfig: the fields of a Hugging Face config.json that a Llama-family decoder needs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.models.gemma_config import GEMMA_MODEL_TYPES, flatten_gemma
from engine.models.layer_types import (
    FULL,
    SLIDING,
    has_local_rope,
    layer_windows,
    rope_parameters,
)

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", *GEMMA_MODEL_TYPES)
_ACTIVATIONS = {"gemma3_text": ("gelu_pytorch_tanh",)}  # others: ("silu", "swish")
_DEFAULT_THETA = {"gemma3_text": 1_000_000.0}  # transformers' default where config.json has none


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    rope_type: str = "default"  # default | linear | dynamic | llama3 | yarn
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn: scaling of cos/sin
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn
    partial_rotary_factor: float = 1.0

    @staticmethod
    def from_hf(raw: dict[str, Any], layer_type: str = FULL) -> RopeConfig:
        """The rope of full-attention layers (FULL), or of windowed ones (SLIDING) where the
        config gives them their own (Gemma 3: rope_local_base_freq)."""
        params = rope_parameters(raw, layer_type)
        if layer_type == FULL:
            fallback = raw.get("rope_theta", _DEFAULT_THETA.get(raw.get("model_type"), 10000.0))
        else:
            fallback = raw.get("rope_local_base_freq", 10000.0)
        theta = params.pop("rope_theta", None) or fallback
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        names = RopeConfig.__dataclass_fields__
        kwargs = {k: v for k, v in params.items() if k in names and v is not None}
        kwargs.setdefault("partial_rotary_factor", raw.get("partial_rotary_factor") or 1.0)
        return RopeConfig(theta=float(theta), rope_type=str(rope_type), **kwargs)


@dataclass(frozen=True)
class ModelConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool  # bias on q/k/v (Qwen2 always; Llama when attention_bias)
    o_proj_bias: bool  # Llama's attention_bias also puts a bias on o_proj
    mlp_bias: bool
    qk_norm: bool  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    # per layer: None = full causal attention, W = the query at p attends keys
    # [max(0, p - W + 1), p] (engine/models/layer_types.py); () = all full
    layer_windows: tuple[int | None, ...] = ()
    local_rope: RopeConfig | None = None  # the rope of windowed layers, where it differs (Gemma 3)
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    torch_dtype: str | None = None
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, hash=False)

    def __post_init__(self) -> None:
        if not self.layer_windows:
            object.__setattr__(self, "layer_windows", (None,) * self.num_hidden_layers)
        if len(self.layer_windows) != self.num_hidden_layers:
            raise ValueError(
                f"layer_windows has {len(self.layer_windows)} entries for "
                f"{self.num_hidden_layers} layers"
            )

    @property
    def has_windows(self) -> bool:
        """Whether any layer attends through a sliding window."""
        return any(w is not None for w in self.layer_windows)

    @property
    def sliding_window(self) -> int | None:
        """The largest window of any layer (None: every layer attends all keys)."""
        return max((w for w in self.layer_windows if w is not None), default=None)

    def layer_rope(self, layer: int) -> RopeConfig:
        """The rope layer `layer` rotates q and k with: local_rope on windowed layers where the
        config has one, else rope."""
        if self.local_rope is not None and self.layer_windows[layer] is not None:
            return self.local_rope
        return self.rope

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @staticmethod
    def from_dict(raw: dict[str, Any]) -> ModelConfig:
        model_type = raw.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}; want {SUPPORTED_MODEL_TYPES}")
        if model_type in GEMMA_MODEL_TYPES:
            raw = flatten_gemma(raw)
            model_type = raw["model_type"]
        act = raw.get("hidden_act", "silu")
        if act not in _ACTIVATIONS.get(model_type, ("silu", "swish")):
            raise ValueError(f"unsupported hidden_act {act!r}")
        heads = int(raw["num_attention_heads"])
        hidden = int(raw["hidden_size"])
        bias = bool(raw.get("attention_bias", False))
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return ModelConfig(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rope=RopeConfig.from_hf(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bias or model_type == "qwen2",
            o_proj_bias=bias and model_type != "qwen2",
            mlp_bias=bool(raw.get("mlp_bias", False)),
            qk_norm=model_type in ("qwen3", "gemma3_text"),
            layer_windows=layer_windows(raw),
            local_rope=RopeConfig.from_hf(raw, SLIDING) if has_local_rope(raw) else None,
            bos_token_id=raw.get("bos_token_id"),
            eos_token_ids=eos_ids,
            torch_dtype=raw.get("torch_dtype") or raw.get("dtype"),
            raw=raw,
        )

    @staticmethod
    def from_file(path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        return ModelConfig.from_dict(json.loads(path.read_text()))
