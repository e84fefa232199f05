"""The engine's statistics as the API reports them: one flat snapshot read at the edge."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class NamespaceCounters:
    cache_salt: str
    query_tokens: int = 0
    hit_tokens: int = 0


@dataclass(frozen=True)
class TierOccupancy:
    used_blocks: int | None = None  # device: blocks held; spill tiers count bytes
    capacity_blocks: int | None = None
    used_bytes: int | None = None
    capacity_bytes: int | None = None


@dataclass(frozen=True)
class EngineCounters:
    query_tokens: int = 0  # prompt tokens looked up in the cache
    hit_tokens: int = 0  # of which found in some tier
    hit_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    evictions_by_tier: dict[str, int] = field(default_factory=dict)  # blocks
    running: int = 0
    waiting: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    occupancy: dict[str, TierOccupancy] = field(default_factory=dict)
    namespaces: dict[str, NamespaceCounters] = field(default_factory=dict)
    redis_nodes: dict[str, dict[str, int]] = field(default_factory=dict)  # "host:port" -> health
    extra: dict[str, Any] = field(default_factory=dict)

    def flat(self) -> dict[str, float]:
        """Cumulative counters by name, for windowed deltas."""
        out = {
            "query_tokens": float(self.query_tokens),
            "hit_tokens": float(self.hit_tokens),
            "prompt_tokens": float(self.prompt_tokens),
            "generation_tokens": float(self.generation_tokens),
        }
        for tier, n in self.hit_tokens_by_tier.items():
            out[f"hit_tokens.{tier}"] = float(n)
        for tier, n in self.evictions_by_tier.items():
            out[f"evictions.{tier}"] = float(n)
        for key, ns in self.namespaces.items():
            out[f"ns.{key}.query_tokens"] = float(ns.query_tokens)
            out[f"ns.{key}.hit_tokens"] = float(ns.hit_tokens)
        return out


def _device_occupancy(cs: Any) -> TierOccupancy:
    return TierOccupancy(used_blocks=cs.cached + cs.referenced, capacity_blocks=cs.num_blocks)


def _tier_stats(snap: dict) -> dict[str, dict]:
    tiers = snap.get("tiers") or {}
    return {name: t for name, t in tiers.items() if name != "store" and isinstance(t, dict)}


def _tier_capacity(engine: Any, name: str) -> int | None:
    tiers = getattr(getattr(engine, "config", None), "tiers", None)
    budget = {"host": "host_bytes", "disk": "disk_bytes"}.get(name)
    return getattr(tiers, budget, None) if tiers is not None and budget else None


def read_counters(engine: Any) -> EngineCounters:
    """One snapshot of the engine's counters (blocking: call it off the event loop)."""
    snap = engine.stats()
    cs = engine.cache_stats()
    total = cs.total()
    by_tier = {k: int(v) for k, v in (snap.get("cached_tokens_by_tier") or {}).items()}
    by_tier.setdefault("device", total.hit_tokens)
    evictions = {"device": total.evicted_blocks}
    occupancy = {"device": _device_occupancy(cs)}
    for name, t in _tier_stats(snap).items():
        evictions[name] = int(t.get("evictions", 0))
        occupancy[name] = TierOccupancy(
            used_bytes=int(t.get("used_bytes", 0)), capacity_bytes=_tier_capacity(engine, name)
        )
        by_tier.setdefault(name, 0)
    namespaces = {
        ns.hex: NamespaceCounters(ns.cache_salt, s.lookup_tokens, s.hit_tokens)
        for ns, s in cs.namespaces.items()
    }
    return EngineCounters(
        query_tokens=total.lookup_tokens,
        hit_tokens=sum(by_tier.values()),
        hit_tokens_by_tier=by_tier,
        evictions_by_tier=evictions,
        running=int(snap.get("running", 0)),
        waiting=int(snap.get("waiting", 0)),
        prompt_tokens=int(snap.get("prefill_tokens", 0)) + int(snap.get("cached_tokens", 0)),
        generation_tokens=int(snap.get("decode_tokens", 0)),
        occupancy=occupancy,
        namespaces=namespaces,
        redis_nodes=dict(_tier_stats(snap).get("redis", {}).get("nodes", {})),
        extra={"cache": cs, "engine": snap},
    )
