"""Read-side analytics of the engine's cache (call on the engine's thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.stats import EngineSnapshot

if TYPE_CHECKING:
    from engine.block_manager import BlockManager
    from engine.kv_tiers import KVTiers
    from engine.scheduler import Scheduler
    from engine.stats import EngineStats
    from radixcache.hashing import Namespace
    from radixcache.prefix_cache import PrefixCache
    from radixcache.stats import PrefixInfo


class CacheAnalytics:
    def __init__(
        self,
        stats: EngineStats,
        scheduler: Scheduler,
        blocks: BlockManager,
        prefix_cache: PrefixCache,
        tiers: KVTiers | None,
    ) -> None:
        self.stats = stats
        self.scheduler = scheduler
        self.blocks = blocks
        self.prefix_cache = prefix_cache
        self.tiers = tiers

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(
            totals=self.stats.copy(),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            cache=self.prefix_cache.stats(),
            tiers=None if self.tiers is None else self.tiers.store.stats(),
        )

    def lookup(self, ns: Namespace, token_ids: list[int]) -> dict[str, int]:
        """Tokens of this prompt's prefix cached per tier, without running or locking it."""
        return self.blocks.lookup(ns, token_ids)

    def hottest_prefixes(self, limit: int, ns: Namespace | None) -> list[PrefixInfo]:
        return self.prefix_cache.hottest_prefixes(limit, ns)
