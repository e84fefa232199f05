"""The paged KV of a model with sliding-window layers, in two pools.

Full-attention layers keep every token's KV: their pool is indexed by the blocks the radix tree
caches. Windowed layers read only the last W keys, so a sequence lets their older blocks go (and
a cached prefix may lose its windowed half while its full half stays): they keep a pool of their
own, usually much smaller (radixcache/window_blocks.py owns its block ids; block 0 is the null
block a released table entry points at).

How the budget is split between the pools: `WindowBudget.split`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.kv.paged_cache import KVCache, bytes_per_block
from engine.kv.quant import KVFormat, pool_row
from radixcache.window_blocks import NULL_BLOCK, blocks_before_hit


@dataclass(frozen=True)
class KVGroups:
    """Which layers keep their KV in which pool (indices into the model's layers)."""

    full_layers: tuple[int, ...]
    window_layers: tuple[int, ...]
    window: int  # the largest window of the windowed layers (tokens)

    @classmethod
    def of(cls, layer_windows: Sequence[int | None], max_model_len: int) -> KVGroups | None:
        """None when no layer's window is shorter than the context: one pool serves all."""
        windowed = tuple(
            i for i, w in enumerate(layer_windows) if w is not None and w < max_model_len
        )
        if not windowed:
            return None
        full = tuple(i for i in range(len(layer_windows)) if i not in windowed)
        return cls(full, windowed, max(layer_windows[i] or 0 for i in windowed))


@dataclass(frozen=True)
class WindowBudget:
    num_full_blocks: int
    num_window_blocks: int  # usable ones (the null block comes on top)

    @classmethod
    def split(
        cls,
        groups: KVGroups,
        *,
        block_size: int,
        max_model_len: int,
        max_num_seqs: int,
        max_chunk: int,
        bytes_per_layer_block: int,
        memory_bytes: int | None,
        num_full_blocks: int | None,
        num_window_blocks: int | None,
    ) -> WindowBudget:
        """What is given explicitly is kept; the rest is sized so that the window pool fits
        (a) as many sequences of `max_model_len` tokens as the full pool: each needs all its
        blocks there and only its window and a chunk here, and (b) at least what max_num_seqs
        shorter sequences read at once (each its window's blocks and one more, plus one step's
        chunk), where the budget has room for it: the twins of cached prefixes (what their hits
        need) live in what the running sequences leave."""
        bs = block_size
        full_per_seq = -(-max_model_len // bs)
        window_per_seq = min(
            full_per_seq, blocks_before_hit(groups.window, bs) + -(-max_chunk // bs) + 1
        )
        ratio = window_per_seq / full_per_seq
        running = max_num_seqs * (blocks_before_hit(groups.window, bs) + 1) + -(-max_chunk // bs)
        floor = max(window_per_seq, running)
        full_bytes = len(groups.full_layers) * bytes_per_layer_block
        window_bytes = len(groups.window_layers) * bytes_per_layer_block
        if num_full_blocks is None:
            if memory_bytes is None:
                raise ValueError("give kv_cache_memory or num_blocks")
            windows = num_window_blocks
            if windows is None:
                by_ratio = int(ratio * memory_bytes / (full_bytes + ratio * window_bytes))
                equal = memory_bytes // (full_bytes + window_bytes)  # no more than full blocks
                windows = max(by_ratio, min(floor, equal))
            if full_bytes:
                num_full_blocks = (memory_bytes - (windows + 1) * window_bytes) // full_bytes
            else:  # every layer is windowed: full blocks only index the tree (no bytes)
                num_full_blocks = int(memory_bytes // window_bytes / ratio)
            num_window_blocks = windows
        if num_window_blocks is None:
            num_window_blocks = min(num_full_blocks, max(floor, int(ratio * num_full_blocks)))
        if num_full_blocks < 1 or num_window_blocks < 1:
            raise ValueError("KV cache budget too small for one block")
        if num_window_blocks < min(window_per_seq, num_full_blocks):  # what one sequence takes
            raise ValueError(
                f"the sliding-window layers' pool needs at least {window_per_seq} blocks (a "
                f"window of {groups.window} tokens and a chunk of {max_chunk}), got "
                f"{num_window_blocks}"
            )
        return cls(num_full_blocks, num_window_blocks)


class HybridKVCache(KVCache):
    """The full-attention layers' pool (`tensor`, as a KVCache) and the windowed layers' pool
    (`window_tensor`, one more block: the null block 0)."""

    def __init__(
        self,
        groups: KVGroups,
        budget: WindowBudget,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_format: KVFormat | None = None,
    ) -> None:
        n_full = len(groups.full_layers)
        super().__init__(
            n_full,
            budget.num_full_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype,
            device,
            kv_format=kv_format,
        )
        self.groups = groups
        self.num_window_blocks = budget.num_window_blocks
        shape = (len(groups.window_layers), 2, budget.num_window_blocks + 1, block_size)
        row, row_dtype = pool_row(head_dim, dtype, kv_format)
        self.window_tensor = torch.zeros(
            (*shape, num_kv_heads, row), dtype=row_dtype, device=device
        )

    @classmethod
    def build(
        cls,
        groups: KVGroups,
        *,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
        max_model_len: int,
        max_num_seqs: int,
        max_chunk: int,
        memory_bytes: int | None,
        num_blocks: int | None,
        num_window_blocks: int | None,
        kv_format: KVFormat | None = None,
    ) -> HybridKVCache:
        budget = WindowBudget.split(
            groups,
            block_size=block_size,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            max_chunk=max_chunk,
            bytes_per_layer_block=bytes_per_block(
                1, block_size, num_kv_heads, head_dim, dtype, kv_format
            ),
            memory_bytes=memory_bytes,
            num_full_blocks=num_blocks,
            num_window_blocks=num_window_blocks,
        )
        return cls(groups, budget, block_size, num_kv_heads, head_dim, dtype, device, kv_format)

    @property
    def nbytes(self) -> int:
        return super().nbytes + self.window_tensor.numel() * self.window_tensor.element_size()

    def release(self) -> None:
        super().release()
        self.window_tensor = self.window_tensor.new_empty(0)

    def copy_window_block(self, src: int, dst: int) -> None:
        self.window_tensor[:, :, dst] = self.window_tensor[:, :, src]

    def block_kv(self, full_block: int, window_block: int) -> torch.Tensor:
        """One block's KV of every layer, in layer order: [layers, 2, bs, Hkv, D] (what a
        spill tier stores)."""
        g, t = self.groups, self.tensor
        num_layers = len(g.full_layers) + len(g.window_layers)
        out = t.new_empty((num_layers, 2, *t.shape[3:]))
        out[list(g.full_layers)] = self.tensor[:, :, full_block]
        out[list(g.window_layers)] = self.window_tensor[:, :, window_block]
        return out

    def write_block(self, full_block: int, window_block: int, kv: torch.Tensor) -> None:
        """The inverse of block_kv (the windowed layers' part dropped for the null block)."""
        g = self.groups
        kv = kv.to(self.tensor.device, self.tensor.dtype)
        self.tensor[:, :, full_block] = kv[list(g.full_layers)]
        if window_block != NULL_BLOCK:  # else the windowed layers' part is not kept
            self.window_tensor[:, :, window_block] = kv[list(g.window_layers)]
