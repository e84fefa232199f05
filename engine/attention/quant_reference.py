"""Attention over a quantized KV pool in torch: the reference the native and triton kernels for
quantized blocks are tested against, and the CPU path where the native kernels do not build.

Per step it dequantizes the blocks the batch's tables name (not the pool) into a small dense
cache, renumbers the tables into it and runs the pure-torch backend there. The new tokens attend
their own keys as stored (quantized), like every later step and every cache hit will."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata, build_attention_metadata
from engine.attention.torch_backend import TorchAttention
from engine.attention.torch_plan import TorchPlan
from engine.kv.quant import KVFormat, dequantize, store_quantized


@dataclass
class DequantPlan:
    used: torch.Tensor  # int64 [U]: the pool blocks the tables name, in order
    slots: torch.Tensor  # int64 [T]: the new tokens' slots in the pool
    dense_slots: torch.Tensor  # int64 [T]: the same in the dense copy
    inner: TorchPlan  # the torch backend's plan over the dense copy


class DequantizingAttention:
    def __init__(self, kv_format: KVFormat) -> None:
        self.kv_format = kv_format
        self.inner = TorchAttention()

    def plan(self, meta: AttentionMetadata) -> DequantPlan:
        used = sorted({b for table in meta.block_tables_list for b in table})
        dense_id = {b: i for i, b in enumerate(used)}
        tables = [[dense_id[b] for b in table] for table in meta.block_tables_list]
        dense = build_attention_metadata(
            meta.query_lens,
            meta.seq_lens_list,
            tables,
            meta.block_size,
            meta.seq_lens.device,
            meta.verify,
        )
        return DequantPlan(
            used=torch.tensor(used, dtype=torch.int64, device=meta.seq_lens.device),
            slots=meta.slot_mapping,
            dense_slots=dense.slot_mapping,
            inner=self.inner.plan(dense),
        )

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,  # uint8 [num_blocks, bs, Hkv, D + 4]
        v_cache: torch.Tensor,
        plan: DequantPlan,
        scale: float,
        window: int | None = None,
        kv_stored: bool = False,
    ) -> torch.Tensor:
        fmt = self.kv_format
        if not kv_stored:
            store_quantized(k, v, k_cache, v_cache, plan.slots, fmt)
        dense_k = dequantize(k_cache.index_select(0, plan.used), fmt, q.dtype)
        dense_v = dequantize(v_cache.index_select(0, plan.used), fmt, q.dtype)
        # the new tokens as stored: rows of the dense copy at their slots
        new_k = dense_k.view(-1, *dense_k.shape[2:]).index_select(0, plan.dense_slots)
        new_v = dense_v.view(-1, *dense_v.shape[2:]).index_select(0, plan.dense_slots)
        return self.inner.forward(
            q, new_k, new_v, dense_k, dense_v, plan.inner, scale, window, kv_stored=True
        )
