"""Gemma 3 (gemma3_text) over a flat ragged batch, on the Llama decoder's fused weights.

What differs from Llama (transformers' modeling_gemma3.py): embeddings scaled by sqrt(hidden) in
the model dtype; every RMSNorm is (1 + w) computed in float32; norms after attention and around
the feed-forward; qk-norm; scale query_pre_attn_scalar ** -0.5; GeGLU with tanh GELU; sliding
layers use their own rope base (rope_local_base_freq); optional final logit softcapping.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention import AttentionBackend
from engine.models.config import ModelConfig
from engine.models.gemma_config import GemmaOptions
from engine.models.llama import DecoderLayer, LayerKV, LlamaForCausalLM, _param
from engine.models.packed_linear import linear
from engine.models.row_ops import RowOps


def _norm(ops: RowOps, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Gemma's RMSNorm: x * rsqrt(mean(x^2) + eps) * weight in float32 throughout (weight:
    (1 + w), float32), cast back: ops.rms_norm of x in float32 computes exactly that."""
    return ops.rms_norm(x.float(), weight, eps).to(x.dtype)


class GemmaDecoderLayer(DecoderLayer):
    def __init__(
        self, config: ModelConfig, index: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(config, dtype, device, config.layer_windows[index])
        c, f32 = config, {"dtype": torch.float32, "device": device}
        for name in GemmaForCausalLM.layer_norms:  # (1 + w) in float32 once loaded
            size = c.head_dim if name in ("q_norm", "k_norm") else c.hidden_size
            setattr(self, name, _param(size, **f32))
        self.options = GemmaOptions.from_hf(c.raw)
        self.scale = self.options.query_pre_attn_scalar**-0.5

    def forward(
        self,
        h: torch.Tensor,  # [T, hidden]: the previous layer's output (the embeddings at layer 0)
        residual: torch.Tensor | None,  # [T, hidden]: the stream before h (None at layer 0)
        cos: torch.Tensor,  # [T, 1, head_dim] of this layer's rope (local or global)
        sin: torch.Tensor,  # [T, 1, head_dim / 2]
        kv: LayerKV,
        attn: AttentionBackend,
        ops: RowOps,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (this layer's output, the stream before it), as DecoderLayer.forward."""
        t, eps, packed = h.shape[0], self.eps, self.packed
        stream = h if residual is None else residual + h
        x = _norm(ops, stream, self.input_layernorm, eps)
        qkv = linear(x, self.qkv_proj, self.qkv_bias, packed.get("qkv_proj"))
        q = qkv[:, : self.q_size].view(t, self.num_heads, self.head_dim)
        k = qkv[:, self.q_size : self.q_size + self.kv_size].view(t, -1, self.head_dim)
        v = qkv[:, self.q_size + self.kv_size :].view(t, self.num_kv_heads, self.head_dim)
        qk = torch.cat([_norm(ops, q, self.q_norm, eps), _norm(ops, k, self.k_norm, eps)], 1)
        qk = ops.rope_store_kv(qk, v, cos, sin, kv.k_cache, kv.v_cache, kv.slots)
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        o = attn.forward(
            q, k, v, kv.k_cache, kv.v_cache, kv.plan, self.scale, self.window, kv_stored=True
        )
        o = linear(o.view(t, self.q_size), self.o_proj, self.o_bias, packed.get("o_proj"))
        stream = stream + _norm(ops, o, self.post_attention_layernorm, eps)
        x = _norm(ops, stream, self.pre_feedforward_layernorm, eps)
        gate_up = linear(x, self.gate_up_proj, self.gate_up_bias, packed.get("gate_up_proj"))
        gate, up = gate_up.chunk(2, dim=-1)
        y = F.gelu(gate, approximate="tanh") * up
        y = linear(y, self.down_proj, self.down_bias, packed.get("down_proj"))
        return _norm(ops, y, self.post_feedforward_layernorm, eps), stream


class GemmaForCausalLM(LlamaForCausalLM):
    layer_norms = (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
        "q_norm",
        "k_norm",
    )

    def __init__(
        self,
        config: ModelConfig,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        attention: AttentionBackend | None = None,
        invariant: bool = False,
    ) -> None:
        super().__init__(config, dtype, device, attention, invariant)
        device = self.device
        self.norm = _param(config.hidden_size, dtype=torch.float32, device=device)
        self.options = GemmaOptions.from_hf(config.raw)
        scale = torch.tensor(config.hidden_size**0.5)  # float32, then the model dtype, like HF
        self.embed_scale = scale.to(dtype=dtype, device=device)

    def make_layer(
        self, config: ModelConfig, index: int, dtype: torch.dtype, device: torch.device
    ) -> GemmaDecoderLayer:
        return GemmaDecoderLayer(config, index, dtype, device)

    def finish_load(self) -> None:
        """Checkpoints hold Gemma's norm weights as w; the forward multiplies by (1 + w)."""
        with torch.no_grad():
            self.norm.add_(1.0)
            for layer in self.layers:
                for name in self.layer_norms:
                    getattr(layer, name).add_(1.0)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.embed_tokens) * self.embed_scale

    def final_norm(self, h: torch.Tensor, residual: torch.Tensor, ops: RowOps) -> torch.Tensor:
        return _norm(ops, residual + h, self.norm, self.config.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        cap = self.options.final_logit_softcapping
        return logits if cap is None else torch.tanh(logits / cap) * cap
