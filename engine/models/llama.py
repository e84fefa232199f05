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
from engine.kv.quant import KVFormat
from engine.models.config import ModelConfig
from engine.models.packed_linear import PackedWeight, linear, pack_weight
from engine.models.rope import LayerRopes
from engine.models.row_ops import RowOps


@dataclass(frozen=True)
class LayerKV:
    """Where one layer's K/V live this step: its pool's rows, the backend's plan over that pool
    and the slots of the step's new tokens in it."""

    k_cache: torch.Tensor  # [num_blocks, bs, Hkv, D]
    v_cache: torch.Tensor
    plan: Any  # attn.plan(meta) of the pool's metadata
    slots: torch.Tensor  # int64 [T]: meta.slot_mapping


@dataclass(frozen=True)
class WindowedKV:
    """The windowed layers' pool of a hybrid KV cache and this batch's tables into it."""

    tensor: torch.Tensor  # [len(layers), 2, num_window_blocks + 1, bs, Hkv, D]
    meta: AttentionMetadata  # the batch's layout over the window pool's block tables
    layers: tuple[int, ...]  # the windowed layers, in order (the rest are in the full pool)

    def layer_kvs(
        self, full: torch.Tensor, full_plan: Any, full_slots: torch.Tensor, window_plan: Any
    ) -> list[LayerKV]:
        """Every layer's LayerKV, in the full pool (with full_plan and its slots) or this one."""
        windowed = set(self.layers)
        out, rows = [], [0, 0]
        for i in range(len(self.layers) + full.shape[0]):
            g = 1 if i in windowed else 0
            pool, plan, slots = (
                (self.tensor, window_plan, self.meta.slot_mapping)
                if g
                else (full, full_plan, full_slots)
            )
            out.append(LayerKV(pool[rows[g], 0], pool[rows[g], 1], plan, slots))
            rows[g] += 1
        return out


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
        h: torch.Tensor,  # [T, hidden]: the previous layer's output (the embeddings at layer 0)
        residual: torch.Tensor | None,  # [T, hidden]: the stream before h (None at layer 0)
        cos: torch.Tensor,  # [T, 1, head_dim]
        sin: torch.Tensor,  # [T, 1, rotary_dim / 2]
        kv: LayerKV,
        attn: AttentionBackend,
        ops: RowOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this layer's output, the stream before it): the stream is residual + h, added
        by the next norm (ops.add_rms_norm) rather than here."""
        t, eps, packed = h.shape[0], self.eps, self.packed
        if residual is None:
            x, residual = ops.rms_norm(h, self.input_layernorm, eps), h
        else:
            x, residual = ops.add_rms_norm(h, residual, self.input_layernorm, eps)
        qkv = linear(x, self.qkv_proj, self.qkv_bias, packed.get("qkv_proj"))
        # q and k heads side by side: [T, Hq + Hkv, D] (a view), roped in one go
        qk = qkv[:, : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = ops.rms_norm(qk[:, : self.num_heads], self.q_norm, eps)
            k = ops.rms_norm(qk[:, self.num_heads :], self.k_norm, eps)
            qk = torch.cat([q, k], dim=1)
        qk = ops.rope_store_kv(qk, v, cos, sin, kv.k_cache, kv.v_cache, kv.slots)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        o = attn.forward(
            q, k, v, kv.k_cache, kv.v_cache, kv.plan, self.scale, self.window, kv_stored=True
        )
        o = linear(o.view(t, self.q_size), self.o_proj, self.o_bias, packed.get("o_proj"))
        x, residual = ops.add_rms_norm(o, residual, self.post_attention_layernorm, eps)
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias, packed.get("gate_up_proj"))
        y = ops.silu_mul(gate_up)
        return linear(y, self.down_proj, self.down_bias, packed.get("down_proj")), residual


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

    def use_kv_format(self, kv_format: KVFormat | None, native: bool | None = None) -> None:
        """The KV pools hold rows of this format (engine/kv/quant.py): the row ops quantize what
        they store, and an attention backend for such pools reads them."""
        self.row_ops = RowOps.for_device(self.device, kv_format)
        self.attention = make_attention_backend(
            self.device,
            native,
            dtype=self.dtype,
            head_dim=self.config.head_dim,
            invariant=self.invariant,
            kv_format=kv_format,
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
        if windowed is None:
            kvs = [
                LayerKV(kv_cache[i, 0], kv_cache[i, 1], plan, meta.slot_mapping)
                for i in range(len(self.layers))
            ]
        else:
            window_plan = self.attention.plan(windowed.meta)
            kvs = windowed.layer_kvs(kv_cache, plan, meta.slot_mapping, window_plan)
        ops, attn, residual = self.row_ops, self.attention, None
        for layer, (cos, sin), kv in zip(self.layers, ropes, kvs, strict=True):
            h, residual = layer.forward(h, residual, cos, sin, kv, attn, ops)
        return self.final_norm(h, residual, ops)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens)

    def final_norm(self, h: torch.Tensor, residual: torch.Tensor, ops: RowOps) -> torch.Tensor:
        """The norm of the stream residual + h after the last layer."""
        return ops.add_rms_norm(h, residual, self.norm, self.config.rms_norm_eps)[0]

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
