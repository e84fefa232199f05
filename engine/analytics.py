"""Read-side analytics of the engine's cache (call on the engine's thread)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.stats import EngineSnapshot

if TYPE_CHECKING:
    from engine.kv import KVCacheManager
    from engine.scheduler import Scheduler
    from engine.stats import EngineStats


class CacheAnalytics:
    def __init__(
        self,
        stats: EngineStats,
        scheduler: Scheduler,
        kv: KVCacheManager,
    ) -> None:
        self.stats = stats
        self.scheduler = scheduler
        self.kv = kv

    def snapshot(self) -> EngineSnapshot:
        return EngineSnapshot(
            totals=self.stats.copy(),
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting)
            + len(self.scheduler.loading)
            + len(self.scheduler.ready),
            cache=self.kv.stats(),
            tiers=self.kv.tier_stats(),
        )
