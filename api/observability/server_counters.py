"""What the sampler records every stats interval: the cache's cumulative counters, the prompt
tokens computed, the TTFT histogram (all differenced per interval), and the gauges of that moment
(requests running / waiting, occupancy per tier)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from api.observability.engine_stats import CacheCounters, EngineCounters, TierOccupancy
from api.observability.latency import LatencyCounts


@dataclass(frozen=True)
class ServerCounters:
    cache: CacheCounters = field(default_factory=CacheCounters)
    computed_tokens: int = 0  # prompt tokens prefilled (not served from a cache)
    ttft: LatencyCounts = field(default_factory=LatencyCounts)
    running: int = 0  # gauges: taken as they are by `minus`
    waiting: int = 0
    occupancy: dict[str, TierOccupancy] = field(default_factory=dict)

    def minus(self, base: ServerCounters) -> ServerCounters:
        return replace(
            self,
            cache=self.cache.minus(base.cache),
            computed_tokens=self.computed_tokens - base.computed_tokens,
            ttft=self.ttft.minus(base.ttft),
        )


def server_counters(engine: EngineCounters, ttft: LatencyCounts) -> ServerCounters:
    return ServerCounters(
        cache=engine.cache,
        computed_tokens=engine.prefill_tokens,
        ttft=ttft,
        running=engine.running,
        waiting=engine.waiting,
        occupancy=engine.occupancy,
    )
