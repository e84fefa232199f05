"""A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, SmolLM2) over a flat ragged batch.

Weights are held fused: qkv_proj = [q; k; v] and gate_up_proj = [gate; up] (see loader).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionBackend, AttentionMetadata, make_attention_backend
from engine.attention.native import NativeKernels, load_native
from engine.models.config import ModelConfig
from engine.models.packed_linear import PackedWeight, linear, pack_weight
from engine.models.rope import LayerRopes, apply_rope


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) * weight over the last dim (float32 statistics)."""
    inv = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32)
    inv = inv.square_().div_(x.shape[-1]).add_(eps).rsqrt_()
    return (x * inv.to(x.dtype)).mul_(weight)


@dataclass(frozen=True)
class WindowedKV:
    """The windowed layers' pool of a hybrid KV cache and this batch's tables into it."""

    tensor: torch.Tensor  # [len(layers), 2, num_window_blocks + 1, bs, Hkv, D]
    meta: AttentionMetadata  # the batch's layout over the window pool's block tables
    layers: tuple[int, ...]  # the windowed layers, in order (the rest are in the full pool)

    def layer_pools(
        self, full: torch.Tensor, full_plan: Any, window_plan: Any
    ) -> list[tuple[torch.Tensor, int, Any]]:
        """(pool, row in it, plan) of every layer."""
        windowed = set(self.layers)
        out, rows = [], [0, 0]
        for i in range(len(self.layers) + full.shape[0]):
            g = 1 if i in windowed else 0
            out.append((self.tensor, rows[1], window_plan) if g else (full, rows[0], full_plan))
            rows[g] += 1
        return out


class RowOps:
    """A layer's RMSNorm on [rows, n] activations: the native op where it built (CPU; one
    dispatch instead of six), torch's otherwise."""

    def __init__(self, native: NativeKernels | None) -> None:
        self.native = native

    @staticmethod
    def for_device(device: torch.device) -> RowOps:
        return RowOps(load_native() if device.type == "cpu" else None)

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        if self.native is None:
            return rms_norm(x, weight, eps)
        return self.native.rms_norm(x, weight, eps)


_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


def _param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype, device=device), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(
        self, config: ModelConfig, dtype: torch.dtype, device: torch.device, window: int | None
    ) -> None:
        super().__init__()
        c, kw = config, {"dtype": dtype, "device": device}
        self.window = window  # sliding window of this layer's attention (None: all keys)
        self.num_heads, self.num_kv_heads, self.head_dim = (
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
        )
        self.q_size, self.kv_size, self.eps = c.q_size, c.kv_size, c.rms_norm_eps
        self.scale = c.head_dim**-0.5
        self.input_layernorm = _param(c.hidden_size, **kw)
        self.qkv_proj = _param(c.q_size + 2 * c.kv_size, c.hidden_size, **kw)
        self.qkv_bias = _param(c.q_size + 2 * c.kv_size, **kw) if c.attention_bias else None
        self.q_norm = _param(c.head_dim, **kw) if c.qk_norm else None
        self.k_norm = _param(c.head_dim, **kw) if c.qk_norm else None
        self.o_proj = _param(c.hidden_size, c.q_size, **kw)
        self.o_bias = _param(c.hidden_size, **kw) if c.o_proj_bias else None
        self.post_attention_layernorm = _param(c.hidden_size, **kw)
        self.gate_up_proj = _param(2 * c.intermediate_size, c.hidden_size, **kw)
        self.gate_up_bias = _param(2 * c.intermediate_size, **kw) if c.mlp_bias else None
        self.down_proj = _param(c.hidden_size, c.intermediate_size, **kw)
        self.down_bias = _param(c.hidden_size, **kw) if c.mlp_bias else None
        self.packed: dict[str, PackedWeight] = {}  # projection name -> oneDNN weight (CPU)

    def prepack(self, invariant: bool = False) -> None:
        """Swap the projection weights for oneDNN-packed copies (the plain ones are freed)."""
        for name in _PROJECTIONS:
            weight = getattr(self, name).data
            self.packed[name] = pack_weight(weight, invariant)
            getattr(self, name).data = torch.empty(0, dtype=weight.dtype)

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden] residual stream
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        k_cache: torch.Tensor,  # [num_blocks, bs, Hkv, D]
        v_cache: torch.Tensor,
        plan: Any,  # attn.plan(meta) of this step
        attn: AttentionBackend,
        ops: RowOps,
    ) -> torch.Tensor:
        t = h.shape[0]
        x = ops.rms_norm(h, self.input_layernorm, self.eps)
        packed = self.packed
        qkv = linear(x, self.qkv_proj, self.qkv_bias, packed.get("qkv_proj"))
        # q and k heads side by side: [T, Hq + Hkv, D] (a view), roped in one go
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = rms_norm(qk[:, : self.num_heads], self.q_norm, self.eps)
            k = rms_norm(qk[:, self.num_heads :], self.k_norm, self.eps)
            qk = torch.cat([q, k], dim=1)
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        o = attn.forward(q, k, v, k_cache, v_cache, plan, self.scale, self.window)
        h = h + linear(o.view(t, self.q_size), self.o_proj, self.o_bias, packed.get("o_proj"))
        x = ops.rms_norm(h, self.post_attention_layernorm, self.eps)
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias, packed.get("gate_up_proj"))
        gate, up = gate_up.chunk(2, dim=-1)
        return h + linear(
            F.silu(gate) * up, self.down_proj, self.down_bias, packed.get("down_proj")
        )


class LlamaForCausalLM(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        attention: AttentionBackend | None = None,
        invariant: bool = False,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        self.config, self.dtype, self.device = config, dtype, device
        self.model_id = ""
        kw = {"dtype": dtype, "device": device}
        self.embed_tokens = _param(config.vocab_size, config.hidden_size, **kw)
        self.layers = nn.ModuleList(
            self.make_layer(config, i, dtype, device) for i in range(config.num_hidden_layers)
        )
        self.norm = _param(config.hidden_size, **kw)
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else _param(config.vocab_size, config.hidden_size, **kw)
        )
        self.packed_lm_head: PackedWeight | None = None
        self.invariant = invariant  # packed matmuls capped to row counts that keep rows' bits
        self.ropes = LayerRopes(config, dtype, device)
        self.row_ops = RowOps.for_device(device)
        self.attention = attention or make_attention_backend(
            device, dtype=dtype, head_dim=config.head_dim, invariant=invariant
        )

    layer_norms = ("input_layernorm", "post_attention_layernorm", "q_norm", "k_norm")

    def make_layer(
        self, config: ModelConfig, index: int, dtype: torch.dtype, device: torch.device
    ) -> DecoderLayer:
        return DecoderLayer(config, dtype, device, config.layer_windows[index])

    def finish_load(self) -> None:
        """Called once the checkpoint's tensors are in (a model that derives weights from them)."""

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_cache: torch.Tensor,  # [layers, 2, num_blocks, bs, Hkv, D]
        meta: AttentionMetadata,
        windowed: WindowedKV | None = None,
    ) -> torch.Tensor:
        """`windowed`: the sliding-window layers' own pool and block tables (a hybrid KV
        cache, engine/kv/hybrid_cache.py); `kv_cache` then holds the other layers, in order."""
        h = self.embed(input_ids)  # [T, hidden]
        ropes = self.ropes.lookup(positions, meta.max_seqlen_k)  # a table per layer's rope
        plan = self.attention.plan(meta)
        where = [(kv_cache, i, plan) for i in range(len(self.layers))]
        if windowed is not None:
            where = windowed.layer_pools(kv_cache, plan, self.attention.plan(windowed.meta))
        ops = self.row_ops
        for layer, (cos, sin), (kv, row, p) in zip(self.layers, ropes, where, strict=True):
            h = layer(h, cos, sin, kv[row, 0], kv[row, 1], p, self.attention, ops)
        return self.final_norm(h, ops)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def final_norm(self, h: torch.Tensor, ops: RowOps) -> torch.Tensor:
        return ops.rms_norm(h, self.norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [S, hidden] (the rows to sample) -> float32 logits [S, vocab]."""
        return linear(hidden, self.lm_head, None, self.packed_lm_head).float()

    def prepack(self) -> bool:
        """On CPU (float32 / bfloat16), hold the projections in oneDNN's packed layout (~1.3x
        faster matmuls for decode-sized batches). Returns whether it packed."""
        if self.device.type != "cpu" or self.dtype not in (torch.bfloat16, torch.float32):
            return False
        if not torch.backends.mkldnn.is_available():
            return False
        try:  # a layer packs name by name, so a failure leaves every layer usable
            for layer in self.layers:
                layer.prepack(self.invariant)
            self.packed_lm_head = pack_weight(self.lm_head.data, self.invariant)
        except RuntimeError:
            return False
        return True
