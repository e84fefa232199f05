"""Moves KV bytes between the paged device pool and the spill tiers (TieredStore); a listener of
the KV cache manager: evicted blocks spill down, committed ones go to a write-through tier.

It knows blocks by id and hash only; which sequence or tree node they belong to is the manager's
business."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.kv.listeners import Committed
    from engine.kv_cache import KVCache
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock
    from storage.tiered import LoadResult, PendingLoad, TieredStore


class KVTiers:
    def __init__(self, store: TieredStore, kv_cache: KVCache) -> None:
        self.store = store
        self.kv_cache = kv_cache
        t = kv_cache.tensor
        self.block_shape = (t.shape[0], t.shape[1], *t.shape[3:])  # [layers, 2, bs, Hkv, D]

    # --- CacheListener ---
    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None:
        """Write-back: queues evicted blocks for the tiers. The store copies their KV before
        returning, so the caller may reuse the ids at once."""
        by_ns: dict[Namespace, list] = defaultdict(list)
        kv = self.kv_cache.tensor
        for b in evicted:
            by_ns[b.namespace].append((b.block_hash, kv[:, :, b.block_id]))
        for ns, items in by_ns.items():
            self.store.store(ns, items)

    def blocks_committed(self, committed: Committed) -> None:
        """Write-through: freshly computed tree blocks go to the shared tier at once."""
        if not self.store.write_through or committed.loaded or not committed.new:
            return
        kv, new = self.kv_cache.tensor, committed.new
        items = [(committed.hashes[i], kv[:, :, committed.block_ids[i]]) for i in new]
        self.store.publish(committed.ns, items)

    # --- loads ---
    def start_load(self, ns: Namespace, hashes: list[int]) -> PendingLoad:
        """Starts loading the longest run of leading `hashes` the tiers hold (off this thread)."""
        return self.store.start_load(ns, hashes, shape=self.block_shape)

    def write(self, block_ids: list[int], loaded: LoadResult) -> None:
        self.kv_cache.write_blocks(block_ids, loaded.blocks)

    def lookup(self, ns: Namespace, hashes: list[int]) -> dict[str, int]:
        """Tokens of the leading run of `hashes` per tier (no data read)."""
        return self.store.lookup_tokens(ns, hashes)

    def close(self) -> None:
        """Finishes queued tier writes and stops the tier threads."""
        self.store.close()
