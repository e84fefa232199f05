"""Read-side analytics of the engine's cache (call on the engine's thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.stats import EngineSnapshot

if TYPE_CHECKING:
    from engine.kv.tiers import KVTiers
    from engine.scheduler import Scheduler
    from engine.stats import EngineStats
    from radixcache.prefix_cache import PrefixCache


class CacheAnalytics:
    def __init__(
        self,
        stats: EngineStats,
        scheduler: Scheduler,
        prefix_cache: PrefixCache,
        tiers: KVTiers | None,
    ) -> None:
        self.stats = stats
        self.scheduler = scheduler
        self.prefix_cache = prefix_cache
        self.tiers = tiers

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(
            totals=self.stats.copy(),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting)
            + len(self.scheduler.loading)
            + len(self.scheduler.ready),
            cache=self.prefix_cache.stats(),
            tiers=None if self.tiers is None else self.tiers.store.stats(),
        )
