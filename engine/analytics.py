"""Read-side analytics of the engine's cache, mixed into LLMEngine (call on the engine's thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.kv_cache import KVCache
    from engine.scheduler import Scheduler
    from engine.stats import EngineStats
    from engine.tier_bridge import TierBridge
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache


class CacheAnalytics:
    stats: EngineStats
    scheduler: Scheduler
    kv_cache: KVCache
    prefix_cache: PrefixCache
    tiers: TierBridge | None

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
        ns = self.namespace_for(cache_salt)
        found = {"device": 0, "host": 0, "disk": 0, "redis": 0}
        match = self.prefix_cache.peek(ns, token_ids)
        found["device"] = match.num_tokens
        if self.tiers is not None:
            found.update(self.tiers.lookup(ns, token_ids, match.num_tokens, match.last_hash))
        return found

    def flush(self, cache_salt: str | None = None) -> int:
        return self.prefix_cache.flush(
            None if cache_salt is None else self.namespace_for(cache_salt)
        )

    def hottest_prefixes(self, limit: int = 10, cache_salt: str | None = None) -> list:
        ns = None if cache_salt is None else self.namespace_for(cache_salt)
        return self.prefix_cache.hottest_prefixes(limit, ns)
