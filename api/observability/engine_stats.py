"""The engine's statistics as the API reports them, read from one typed EngineSnapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.speculative.stats import SpecStats
from radixcache.shared.tier_names import TierName

if TYPE_CHECKING:
    from engine.stats import EngineSnapshot
    from radixcache.stats import CacheStats


@dataclass(frozen=True)
class NamespaceCounters:
    cache_salt: str
    query_tokens: int = 0
    hit_tokens: int = 0


@dataclass(frozen=True)
class CacheCounters:
    """Cumulative counters: a window is the difference of two samples (`minus`)."""

    query_tokens: int = 0  # prompt tokens looked up in the cache
    hit_tokens: int = 0  # of which found in some tier
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    evictions_by_tier: dict[str, int] = field(default_factory=dict)  # blocks
    output_tokens: int = 0  # tokens sent to clients (counted by the API)
    namespaces: dict[str, NamespaceCounters] = field(default_factory=dict)  # by namespace hex

    def minus(self, base: CacheCounters) -> CacheCounters:
        def sub(now: dict[str, int], then: dict[str, int]) -> dict[str, int]:
            return {k: v - then.get(k, 0) for k, v in now.items()}

        empty = NamespaceCounters("")
        return CacheCounters(
            query_tokens=self.query_tokens - base.query_tokens,
            hit_tokens=self.hit_tokens - base.hit_tokens,
            hit_tokens_by_tier=sub(self.hit_tokens_by_tier, base.hit_tokens_by_tier),
            evictions_by_tier=sub(self.evictions_by_tier, base.evictions_by_tier),
            output_tokens=self.output_tokens - base.output_tokens,
            namespaces={
                key: NamespaceCounters(
                    ns.cache_salt,
                    ns.query_tokens - base.namespaces.get(key, empty).query_tokens,
                    ns.hit_tokens - base.namespaces.get(key, empty).hit_tokens,
                )
                for key, ns in self.namespaces.items()
            },
        )


@dataclass(frozen=True)
class TierOccupancy:
    used_blocks: int | None = None  # device: blocks held; spill tiers count bytes
    capacity_blocks: int | None = None
    used_bytes: int | None = None
    capacity_bytes: int | None = None  # None on a spill tier: no budget of ours (Redis)
    block_bytes: int | None = None  # a spill tier's stored block, as measured by its writes


@dataclass(frozen=True)
class RetentionCounters:
    """prompt_cache_retention's blocks in the persistent tier (storage/retention.py)."""

    tier: str
    retained_blocks: int
    retained_bytes: int
    budget_bytes: int
    granted_blocks: int  # retentions given or renewed
    dropped_blocks: int  # retentions ended early past the budget, oldest first
    expired_blocks: int  # retentions that ran their full time


@dataclass(frozen=True)
class TierTraffic:
    """What moved between the device and the spill tiers (storage/store_stats.py)."""

    loads: int  # loads that asked the tiers
    loaded_blocks: int
    load_deadline_misses: int  # loads taken before they were done: the rest was recomputed
    load_errors: int  # loads cut short by a tier's failure (recomputed)
    stored_blocks: int  # blocks handed to the writer
    dropped_writes: int  # blocks not written: the writer's queue was full
    pending_writes: int  # queued, not yet written


@dataclass(frozen=True)
class EngineCounters:
    cache: CacheCounters
    device: CacheStats
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0  # all prompt tokens, cached or computed
    prefill_tokens: int = 0  # prompt tokens computed (recomputes after preemption included)
    generation_tokens: int = 0
    occupancy: dict[str, TierOccupancy] = field(default_factory=dict)
    redis_nodes: dict[str, dict[str, int]] = field(default_factory=dict)  # "host:port" -> health
    spec: SpecStats = field(default_factory=SpecStats)  # a copy: speculative decoding
    retention: RetentionCounters | None = None  # None: no persistent tier
    tier_traffic: TierTraffic | None = None  # None: no spill tier


def _redis_nodes(snap: EngineSnapshot) -> dict[str, dict[str, int]]:
    redis = None if snap.tiers is None else snap.tiers.tiers.get(TierName.REDIS)
    nodes = getattr(redis.stats, "nodes", {}) if redis is not None else {}
    return {name: h.snapshot() for name, h in sorted(nodes.items())}


def _retention(snap: EngineSnapshot) -> RetentionCounters | None:
    if snap.tiers is None or snap.tiers.retention is None:
        return None
    tier, r = snap.tiers.retention
    return RetentionCounters(
        tier, r.blocks, r.bytes, r.budget_bytes, r.granted, r.dropped, r.expired
    )


def _tier_traffic(snap: EngineSnapshot) -> TierTraffic | None:
    if snap.tiers is None:
        return None
    st = snap.tiers.store
    return TierTraffic(
        st.loads,
        st.loaded_blocks,
        st.deadline_misses,
        st.load_errors,
        st.stored_blocks,
        st.dropped_blocks,
        snap.tiers.pending_blocks,
    )


def read_counters(snap: EngineSnapshot, output_tokens: int) -> EngineCounters:
    cs, totals, device_total = snap.cache, snap.totals, snap.cache.total()
    by_tier = dict(totals.cached_tokens_by_tier)
    by_tier.setdefault(TierName.DEVICE, device_total.hit_tokens)
    evictions = {TierName.DEVICE: device_total.evicted_blocks}
    occupancy = {
        TierName.DEVICE: TierOccupancy(
            used_blocks=cs.cached + cs.referenced, capacity_blocks=cs.num_blocks
        )
    }
    if snap.tiers is not None:
        for name, tier in snap.tiers.tiers.items():
            evictions[name] = tier.stats.evictions
            written = tier.stats.blocks_written
            occupancy[name] = TierOccupancy(
                used_bytes=tier.used_bytes,
                capacity_bytes=tier.capacity_bytes,
                block_bytes=tier.stats.bytes_written // written if written else None,
            )
            by_tier.setdefault(name, 0)
    namespaces = {
        ns.hex: NamespaceCounters(ns.cache_salt, s.lookup_tokens, s.hit_tokens)
        for ns, s in cs.namespaces.items()
    }
    cache = CacheCounters(
        query_tokens=device_total.lookup_tokens,
        hit_tokens=sum(by_tier.values()),
        hit_tokens_by_tier=by_tier,
        evictions_by_tier=evictions,
        output_tokens=output_tokens,
        namespaces=namespaces,
    )
    return EngineCounters(
        cache=cache,
        device=cs,
        running=snap.running,
        waiting=snap.waiting,
        prompt_tokens=totals.prefill_tokens + totals.cached_tokens,
        prefill_tokens=totals.prefill_tokens,
        # a verify row computes one decode token and emits its accepted draft tokens too
        generation_tokens=totals.decode_tokens + totals.spec.num_accepted_tokens,
        occupancy=occupancy,
        redis_nodes=_redis_nodes(snap),
        spec=totals.spec,
        retention=_retention(snap),
        tier_traffic=_tier_traffic(snap),
    )
