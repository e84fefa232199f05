"""Tiny KV blocks for the storage tests: their shape, random contents, chained hashes, encodings."""

from __future__ import annotations

import torch

from radixcache.hashing import Namespace, block_hashes
from storage.codec import encode_block

# one block: [layers, 2, block_size, kv_heads, head_dim]
BLOCK_SHAPE = (2, 2, 4, 2, 8)


def make_block(seed: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(BLOCK_SHAPE, generator=gen).to(dtype)


def chain(ns: Namespace, n: int, start: int = 0) -> list[int]:
    """n chained block hashes of a synthetic token sequence."""
    return block_hashes(ns, list(range(start, start + n * ns.block_size)))


def encoded(hashes: list[int], seed: int = 0) -> list[tuple[int, bytes]]:
    return [(h, encode_block(make_block(seed + i))) for i, h in enumerate(hashes)]


VALUE_BYTES = len(encode_block(make_block(0)))
