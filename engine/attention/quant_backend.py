"""Attention over a quantized KV pool on CPU with the native kernel (engine/attention/csrc/
quant_attention.cpp): every row of a step, prefill and decode alike, in one paged_attention_q
call that reads the pool's packed rows in place and dequantizes them inside the kernel. Its
results are batch-, chunk- and cache-invariant (a row's bits depend on its q, position and keys
only), so the deterministic mode runs it as it is. The torch reference is quant_reference.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.native import NativeKernels
from engine.kv.quant import KVFormat


@dataclass
class QuantPlan:
    slots: torch.Tensor  # int64 [T]: the new tokens' slots in the pool
    q_starts: torch.Tensor  # int32 [B]: first row of each sequence's new tokens
    q_lens: torch.Tensor  # int32 [B]
    seq_lens: torch.Tensor  # int32 [B]: context length after this step
    block_tables: torch.Tensor  # int32 [B, max_blocks]


class QuantizedAttention:
    def __init__(self, native: NativeKernels, kv_format: KVFormat) -> None:
        self.native = native
        self.kv_format = kv_format

    def plan(self, meta: AttentionMetadata) -> QuantPlan:
        device = meta.seq_lens.device
        return QuantPlan(
            slots=meta.slot_mapping,
            q_starts=meta.cu_seqlens_q[:-1].contiguous(),
            q_lens=torch.tensor(meta.query_lens, dtype=torch.int32, device=device),
            seq_lens=meta.seq_lens,
            block_tables=meta.block_tables,
        )

    def forward(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        v: torch.Tensor,
        k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4]
        v_cache: torch.Tensor,
        plan: QuantPlan,
        scale: float,
        window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """kv_stored: k and v are in the caches already (RowOps.rope_store_kv quantized them)."""
        if window is not None and window < 1:
            raise ValueError(f"sliding window must be at least 1, got {window}")
        if not kv_stored:
            self.native.quantize_store_kv(k, v, k_cache, v_cache, plan.slots, self.kv_format)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        self.native.paged_attention_q(
            q,
            k_cache,
            v_cache,
            out,
            plan.q_starts,
            plan.q_lens,
            plan.seq_lens,
            plan.block_tables,
            scale,
            window,
            self.kv_format,
        )
        return out
