"""The device KV pools' block counts, under one set of names for every report (/v1/cache/stats,
/v1/cache/integrity, /metrics)."""

from __future__ import annotations

from typing import Any

from radixcache.stats import CacheStats


def block_counts(cache: CacheStats) -> dict[str, int]:
    """The device pool's blocks by state."""
    return {
        "num_blocks": cache.num_blocks,
        "free": cache.free,
        "evictable": cache.evictable,
        "referenced": cache.referenced,
        "pinned": cache.pinned,
        "cached": cache.cached,
    }


def layer_types_report(cache: CacheStats) -> dict[str, dict[str, Any]]:
    """A hybrid cache's two pools: blocks by state and the tokens each kind of layer could
    reuse (a windowed layer's hit is cut to where its blocks before the hit are present)."""
    w = cache.windows
    assert w is not None
    return {
        "full_attention": {
            "num_blocks": cache.num_blocks,
            "free": cache.free,
            "evictable": cache.evictable,
            "referenced": cache.referenced,
            "cached": cache.cached,
            "hit_tokens": w.full_hit_tokens,
        },
        "sliding_window": {
            "window": w.window,
            "num_blocks": w.num_blocks,
            "free": w.free,
            "evictable": w.evictable,
            "referenced": w.referenced,
            "cached": w.cached,
            "tombstones": w.tombstones,
            "evicted": w.evicted,
            "hit_tokens": w.hit_tokens,
        },
    }
