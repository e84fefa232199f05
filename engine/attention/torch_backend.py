"""Torch reference attention over the paged KV cache (the CPU path; also runs on CUDA)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata, DecodePlan, PrefillSegment


def write_kv(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots
) -> None:
    """k/v [T, Hkv, D] -> caches [num_blocks, bs, Hkv, D] at flat slots [T]."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, v)


def _gather(cache: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    # cache [num_blocks, bs, Hkv, D] -> [len(block_ids) * bs, Hkv, D]
    return cache.index_select(0, block_ids).flatten(0, 1)


class TorchAttention:
    """Prefill: SDPA per sequence; decode: every one-token sequence in one batched call."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        # q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]
        write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        for seg in meta.prefills:
            out[seg.start : seg.end] = self._prefill(q, k, v, k_cache, v_cache, seg, scale)
        if meta.decode is not None:
            self._decode(q, k_cache, v_cache, meta.decode, scale, out)
        return out

    @staticmethod
    def _prefill(q, k, v, k_cache, v_cache, seg: PrefillSegment, scale: float) -> torch.Tensor:
        qs = q[seg.start : seg.end].transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
        if seg.block_ids is None:  # nothing cached: keys are this step's own tokens
            ks, vs = k[seg.start : seg.end], v[seg.start : seg.end]
        else:
            ks = _gather(k_cache, seg.block_ids)[: seg.ctx_len]
            vs = _gather(v_cache, seg.block_ids)[: seg.ctx_len]
        o = F.scaled_dot_product_attention(
            qs,
            ks.transpose(0, 1).unsqueeze(0),
            vs.transpose(0, 1).unsqueeze(0),
            attn_mask=seg.mask,
            is_causal=seg.mask is None,
            scale=scale,
            enable_gqa=True,
        )
        return o[0].transpose(0, 1)

    @staticmethod
    def _decode(q, k_cache, v_cache, plan: DecodePlan, scale: float, out: torch.Tensor) -> None:
        qd = q[plan.row_slice] if plan.row_slice is not None else q.index_select(0, plan.rows)
        b, hq, d = qd.shape
        hkv = k_cache.shape[2]
        ks = _gather(k_cache, plan.block_ids).view(b, -1, hkv, d).transpose(1, 2)
        vs = _gather(v_cache, plan.block_ids).view(b, -1, hkv, d).transpose(1, 2)
        # grouped query heads: [B, Hkv, G, D] @ [B, Hkv, D, L] -> [B, Hkv, G, L]
        scores = torch.matmul(qd.view(b, hkv, hq // hkv, d), ks.transpose(-1, -2)).float()
        scores.mul_(scale).masked_fill_(~plan.mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(vs.dtype)
        o = torch.matmul(probs, vs).view(b, hq, d)
        if plan.row_slice is not None:
            out[plan.row_slice] = o
        else:
            out.index_copy_(0, plan.rows, o)
