"""The engine side of the spill tiers: evicted device blocks go down to the TieredStore
(write-back), and at admission the blocks after the device match are loaded back up."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from radixcache.hashing import block_hashes

if TYPE_CHECKING:
    from engine.kv_cache import KVCache
    from engine.request import Sequence
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import EvictedBlock, PrefixCache
    from storage.tiered import TieredStore


class TierBridge:
    def __init__(self, store: TieredStore, kv_cache: KVCache) -> None:
        self.store = store
        self.kv_cache = kv_cache
        self.cache: PrefixCache  # set once the PrefixCache (which calls on_evict) exists
        t = kv_cache.tensor
        self.block_shape = (t.shape[0], t.shape[1], *t.shape[3:])  # [layers, 2, bs, Hkv, D]

    def on_evict(self, blocks: list[EvictedBlock]) -> None:
        """PrefixCache callback, before the ids are reused: copy their KV out (the store copies)."""
        by_ns: dict[Namespace, list] = defaultdict(list)
        kv = self.kv_cache.tensor
        for b in blocks:
            by_ns[b.namespace].append((b.block_hash, kv[:, :, b.block_id]))
        for ns, items in by_ns.items():
            self.store.store(ns, items)

    def publish(self, ns: Namespace, hashes: list[int], block_ids: list[int]) -> None:
        """Write-through: freshly computed tree blocks go to the shared tier at once."""
        if self.store.write_through and block_ids:
            kv = self.kv_cache.tensor
            self.store.publish(
                ns, [(h, kv[:, :, b]) for h, b in zip(hashes, block_ids, strict=True)]
            )

    def following_hashes(self, seq: Sequence, last_hash: int | None) -> list[int]:
        """Chained hashes of the full blocks of tokens[:-1] after the device match."""
        bs = self.kv_cache.block_size
        start = seq.num_computed_tokens
        end = (seq.num_tokens - 1) // bs * bs
        if end <= start:
            return []
        return block_hashes(seq.request.namespace, seq.token_ids[start:end], parent_hash=last_hash)

    def load_back(self, seq: Sequence, last_hash: int | None) -> int:
        """Loads the longest run of following blocks from the tiers into new device blocks and
        inserts them into the tree (seq's lock moves to the new deepest node). Returns tokens."""
        ns = seq.request.namespace
        hashes = self.following_hashes(seq, last_hash)
        if not hashes:
            return 0
        loaded = self.store.load_prefix(ns, hashes, shape=self.block_shape)
        k = len(loaded.blocks)
        ids = self.cache.allocate(k) if k else None
        if not ids:
            return 0
        self.kv_cache.write_blocks(ids, loaded.blocks)
        bs = self.kv_cache.block_size
        start = seq.num_computed_tokens
        result = self.cache.insert(ns, seq.token_ids[: start + k * bs], seq.block_ids + ids)
        duplicates = [b for b in result.duplicates if b in ids]
        if duplicates:
            self.cache.free(duplicates)
        self.cache.lock(result.handle)
        if seq.handle is not None:
            self.cache.unlock(seq.handle)
        seq.handle = result.handle
        seq.block_ids = list(result.block_ids)
        seq.num_tree_blocks = len(seq.block_ids)
        seq.num_computed_tokens = start + k * bs
        if seq.num_preemptions == 0:
            seq.num_cached_tokens += k * bs
            for name in loaded.tiers:
                seq.cached_by_tier[name] = seq.cached_by_tier.get(name, 0) + bs
        return k * bs

    def lookup(self, ns: Namespace, tokens: list[int], device_tokens: int, last_hash) -> dict:
        bs = self.kv_cache.block_size
        end = len(tokens) // bs * bs
        if end <= device_tokens:
            return {}
        hashes = block_hashes(ns, tokens[device_tokens:end], parent_hash=last_hash)
        return self.store.lookup_tokens(ns, hashes)
