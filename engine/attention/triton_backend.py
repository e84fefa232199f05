"""The CUDA attention backend: triton kernels over the paged KV cache."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.triton_kernels import paged_attention, store_kv
from engine.kv.quant import KVFormat


class TritonAttention:
    """kv_format: the caches hold packed rows of that format (engine/kv/quant.py): stores
    quantize, the attention kernel dequantizes as it reads."""

    def __init__(self, kv_format: KVFormat | None = None) -> None:
        self.kv_format = kv_format

    def plan(self, meta: AttentionMetadata) -> AttentionMetadata:
        return meta  # the kernels read the metadata's tensors directly

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]; kv_stored: k and v are in the caches
        already (TritonRowOps.rope_store_kv wrote them), so they are not stored again."""
        if not kv_stored:
            store_kv(k, v, k_cache, v_cache, meta.slot_mapping, self.kv_format)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        paged_attention(q, k_cache, v_cache, out, meta, scale, window, self.kv_format)
        return out
