"""The paged KV tensor: [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim].

Owns storage only; which block holds what is the prefix cache's business."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.dtypes import DTYPES  # noqa: F401 (engine/factory.py reads the table from here for now)
from engine.kv.quant import KVFormat, pool_row


def bytes_per_block(
    num_layers: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    kv_format: KVFormat | None = None,
) -> int:
    row, row_dtype = pool_row(head_dim, dtype, kv_format)
    return num_layers * 2 * block_size * num_kv_heads * row * row_dtype.itemsize


class KVCache:
    """kv_format: the pool holds quantized rows ([.., Hkv, D + 4] bytes: engine/kv/quant.py)
    instead of the model dtype's [.., Hkv, D]."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        scratch_block: bool = False,
        kv_format: KVFormat | None = None,
    ) -> None:
        self.num_blocks = num_blocks
        self.kv_format = kv_format
        self.block_size = block_size
        # one block past num_blocks that no sequence owns: padded rows of a replayed decode
        # graph write their K/V there (engine/cuda_graphs/runner.py)
        self.scratch_block: int | None = num_blocks if scratch_block else None
        row, row_dtype = pool_row(head_dim, dtype, kv_format)
        shape = (num_layers, 2, num_blocks + scratch_block, block_size, num_kv_heads, row)
        self.tensor = torch.zeros(shape, dtype=row_dtype, device=device)

    @classmethod
    def from_budget(
        cls,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        *,
        memory_bytes: int | None = None,
        num_blocks: int | None = None,
        scratch_block: bool = False,
        kv_format: KVFormat | None = None,
    ) -> KVCache:
        """scratch_block: one block more than num_blocks (within memory_bytes when sized by it)."""
        if num_blocks is None:
            if memory_bytes is None:
                raise ValueError("give kv_cache_memory or num_blocks")
            per_block = bytes_per_block(
                num_layers, block_size, num_kv_heads, head_dim, dtype, kv_format
            )
            num_blocks = memory_bytes // per_block - scratch_block
        if num_blocks < 1:
            raise ValueError("KV cache budget too small for one block")
        return cls(
            num_layers,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
            device,
            scratch_block,
            kv_format,
        )

    @classmethod
    def for_model(
        cls,
        model: torch.nn.Module,
        num_blocks: int,
        block_size: int,
        kv_format: KVFormat | None = None,
    ) -> KVCache:
        """A zeroed cache of `model`'s layout, dtype and device (tests, benchmarks)."""
        c = model.config
        return cls(
            c.num_hidden_layers,
            num_blocks,
            block_size,
            c.num_key_value_heads,
            c.head_dim,
            model.dtype,
            model.device,
            kv_format=kv_format,
        )

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()

    def release(self) -> None:
        """Frees the pool now (a closed engine's parts hold each other: left to the cycle
        collector, the memory would go only at its next pass)."""
        self.tensor = self.tensor.new_empty(0)

    def copy_block(self, src: int, dst: int) -> None:
        self.tensor[:, :, dst] = self.tensor[:, :, src]

    def write_blocks(self, block_ids: Sequence[int], blocks: Sequence[torch.Tensor]) -> None:
        for block_id, kv in zip(block_ids, blocks, strict=True):
            self.tensor[:, :, block_id] = kv.to(self.tensor.device, self.tensor.dtype)
