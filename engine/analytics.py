"""Read-side analytics of the engine's cache, mixed into LLMEngine (call on the engine's thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.block_manager import BlockManager
    from engine.kv_cache import KVCache
    from engine.kv_tiers import KVTiers
    from engine.scheduler import Scheduler
    from engine.stats import EngineStats
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache


class CacheAnalytics:
    stats: EngineStats
    scheduler: Scheduler
    kv_cache: KVCache
    prefix_cache: PrefixCache
    tiers: KVTiers | None
    blocks: BlockManager

    def namespace_for(self, cache_salt: str = "") -> Namespace:
        raise NotImplementedError

    def stats_snapshot(self) -> dict[str, Any]:
        snap = self.stats.snapshot()
        snap["running"] = len(self.scheduler.running)
        snap["waiting"] = len(self.scheduler.waiting)
        snap["num_blocks"] = self.kv_cache.num_blocks
        snap["free_blocks"] = self.prefix_cache.num_free_blocks()
        snap["evictable_blocks"] = self.prefix_cache.num_evictable_blocks()
        if self.tiers is not None:
            snap["tiers"] = self.tiers.store.stats()
        return snap

    def lookup(self, token_ids: list[int], cache_salt: str = "") -> dict[str, int]:
        """Tokens of this prompt's prefix cached per tier, without running or locking it."""
        return self.blocks.lookup(self.namespace_for(cache_salt), token_ids)

    def flush(self, cache_salt: str | None = None) -> int:
        return self.blocks.flush(None if cache_salt is None else self.namespace_for(cache_salt))

    def hottest_prefixes(self, limit: int = 10, cache_salt: str | None = None) -> list:
        ns = None if cache_salt is None else self.namespace_for(cache_salt)
        return self.prefix_cache.hottest_prefixes(limit, ns)
