"""Rotary position embeddings: inverse frequencies for each rope_type and a cos/sin table."""

from __future__ import annotations

import math

import torch

from engine.models.config import ModelConfig, RopeConfig


def _default_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    return 1.0 / (rope.theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def _llama3_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    inv_freq = _default_inv_freq(rope, dim)
    old_len = rope.original_max_position_embeddings or 8192
    low_wavelen = old_len / rope.low_freq_factor
    high_wavelen = old_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_inv_freq(rope: RopeConfig, dim: int, max_pos: int) -> tuple[torch.Tensor, float]:
    factor = rope.factor
    orig = rope.original_max_position_embeddings or max_pos
    attention_factor = rope.attention_factor
    if attention_factor is None:
        if rope.mscale and rope.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(
                factor, rope.mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(attention_factor)


def rope_inv_freq(
    config: ModelConfig, rope: RopeConfig | None = None
) -> tuple[torch.Tensor, float]:
    """(inv_freq [rotary_dim / 2] float32, scaling of cos/sin) for rope (default: config.rope).

    "dynamic" (NTK) equals "default" for positions below max_position_embeddings, which is the
    range the engine serves; it is treated as "default" (no per-batch base change).
    """
    rope = rope or config.rope
    dim = int(config.head_dim * rope.partial_rotary_factor)
    if rope.rope_type in ("default", "dynamic"):
        return _default_inv_freq(rope, dim), 1.0
    if rope.rope_type == "linear":
        return _default_inv_freq(rope, dim) / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3_inv_freq(rope, dim), 1.0
    if rope.rope_type == "yarn":
        return _yarn_inv_freq(rope, dim, config.max_position_embeddings)
    raise ValueError(f"unsupported rope_type {rope.rope_type!r}")


class RotaryEmbedding:
    """cos/sin tables [max_positions, head_dim] grown on demand (by powers of two).

    cos is laid out as [cos, cos, 1...] and sin as [sin, pad...] so that rotate-half RoPE of a
    head is x * cos + [-x2, x1] * sin on the rotary dims, and the identity on the others.
    """

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype,
        device: torch.device,
        rope: RopeConfig | None = None,  # default: config.rope
    ) -> None:
        self.inv_freq, self.scaling = rope_inv_freq(config, rope)
        self.inv_freq = self.inv_freq.to(device)
        self.head_dim = config.head_dim
        self.dtype = dtype
        self.device = device
        self.cos = torch.empty(0, self.head_dim, dtype=dtype, device=device)
        self.sin = torch.empty(0, self.inv_freq.numel(), dtype=dtype, device=device)
        self.ensure(min(config.max_position_embeddings, 4096))

    def ensure(self, num_positions: int) -> None:
        if num_positions <= self.cos.shape[0]:
            return
        size = 1 << max(num_positions - 1, 1).bit_length()
        t = torch.arange(size, dtype=torch.int64, device=self.device).float()
        freqs = torch.outer(t, self.inv_freq)
        cos = (freqs.cos() * self.scaling).to(self.dtype)
        half = cos.shape[1]
        self.cos = torch.ones(size, self.head_dim, dtype=self.dtype, device=self.device)
        self.cos[:, :half] = cos
        self.cos[:, half : 2 * half] = cos
        self.sin = (freqs.sin() * self.scaling).to(self.dtype)

    def lookup(
        self, positions: torch.Tensor, max_position: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos [T, 1, head_dim], sin [T, 1, rotary_dim / 2] for positions [T] (< max_position)."""
        self.ensure(max_position)
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


class LayerRopes:
    """One cos/sin table per distinct rope of the layers (config.layer_rope): Llama-family
    models have one; Gemma 3 a second, local one for its windowed layers."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype, device: torch.device) -> None:
        ropes = [config.layer_rope(i) for i in range(config.num_hidden_layers)]
        self.tables = {r: RotaryEmbedding(config, dtype, device, r) for r in dict.fromkeys(ropes)}
        self.layer_table = [list(self.tables).index(r) for r in ropes]

    def lookup(
        self, positions: torch.Tensor, max_position: int
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, its (cos, sin) for positions [T] (RotaryEmbedding.lookup), each table's
        looked up once."""
        found = [table.lookup(positions, max_position) for table in self.tables.values()]
        return [found[i] for i in self.layer_table]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE of x [T, H, D] (any strides) -> a new contiguous tensor (3 kernels)."""
    half = sin.shape[-1]
    out = x * cos
    out[..., :half].addcmul_(x[..., half : 2 * half], sin, value=-1.0)
    out[..., half : 2 * half].addcmul_(x[..., :half], sin)
    return out
