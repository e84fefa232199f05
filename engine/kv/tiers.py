"""Moves KV bytes between the paged device pool and the spill tiers (TieredStore); a listener of
the KV cache manager: evicted blocks spill down, committed ones go to a write-through tier.

It knows blocks by id and hash only; which sequence or tree node they belong to is the manager's
business."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

import torch

from engine.hybrid_kv_cache import HybridKVCache
from radixcache.window_blocks import NULL_BLOCK

if TYPE_CHECKING:
    from engine.kv.listeners import Committed
    from engine.kv_cache import KVCache
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock
    from radixcache.window_blocks import WindowBlocks
    from storage.tiered import LoadResult, PendingLoad, TieredStore


class KVTiers:
    """With a hybrid KV cache a stored block holds every layer's KV, in layer order: a block
    whose windowed twin was evicted on its own is not spilled (a load stops there, and what
    follows is recomputed)."""

    def __init__(
        self, store: TieredStore, kv_cache: KVCache, windows: WindowBlocks | None = None
    ) -> None:
        self.store = store
        self.kv_cache = kv_cache
        self.windows = windows
        t = kv_cache.tensor
        num_layers = t.shape[0]
        if isinstance(kv_cache, HybridKVCache):
            num_layers += kv_cache.window_tensor.shape[0]
        self.block_shape = (num_layers, t.shape[1], *t.shape[3:])  # [layers, 2, bs, Hkv, D]

    def _block_kv(self, block_id: int, window_block: int) -> torch.Tensor | None:
        if isinstance(self.kv_cache, HybridKVCache):
            if window_block == NULL_BLOCK:
                return None
            return self.kv_cache.block_kv(block_id, window_block)
        return self.kv_cache.tensor[:, :, block_id]

    # --- CacheListener ---
    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None:
        """Write-back: queues evicted blocks for the tiers. The store copies their KV before
        returning, so the caller may reuse the ids at once."""
        by_ns: dict[Namespace, list] = defaultdict(list)
        for b in evicted:
            kv = self._block_kv(b.block_id, b.window_block)
            if kv is not None:
                by_ns[b.namespace].append((b.block_hash, kv))
        for ns, items in by_ns.items():
            self.store.store(ns, items)

    def blocks_committed(self, committed: Committed) -> None:
        """Write-through: freshly computed tree blocks go to the shared tier at once."""
        if not self.store.write_through or committed.loaded or not committed.new:
            return
        items = []
        for i in committed.new:
            f = committed.block_ids[i]
            twin = self.windows.twin_of(f) if self.windows is not None else NULL_BLOCK
            kv = self._block_kv(f, twin)
            if kv is None:
                break  # hashes chain: a block after a missing one could not be loaded
            items.append((committed.hashes[i], kv))
        if items:
            self.store.publish(committed.ns, items)

    def twins_evicted(self, block_hashes: list[int]) -> None:
        """Nothing to spill: the block goes down whole, with its twin, or not at all."""

    # --- loads ---
    def start_load(self, ns: Namespace, hashes: list[int]) -> PendingLoad:
        """Starts loading the longest run of leading `hashes` the tiers hold (off this thread)."""
        return self.store.start_load(ns, hashes, shape=self.block_shape)

    def write(self, block_ids: list[int], loaded: LoadResult, window_ids: list[int]) -> None:
        """Loaded blocks into device blocks (a hybrid cache: the windowed layers' part into
        `window_ids` where it is not the null block, else dropped)."""
        kv_cache = self.kv_cache
        if not isinstance(kv_cache, HybridKVCache):
            kv_cache.write_blocks(block_ids, loaded.blocks)
            return
        for f, w, kv in zip(block_ids, window_ids, loaded.blocks, strict=True):
            kv_cache.write_block(f, w, kv)

    def lookup(self, ns: Namespace, hashes: list[int]) -> dict[str, int]:
        """Tokens of the leading run of `hashes` per tier (no data read)."""
        return self.store.lookup_tokens(ns, hashes)

    def close(self) -> None:
        """Finishes queued tier writes and stops the tier threads."""
        self.store.close()
