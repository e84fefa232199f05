"""The /v1/cache/stats document: hit rates (overall, per tier, per namespace; since start and over
a recent window), tokens and compute saved, occupancy and evictions per tier."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from api.auth import Caller
from api.engine_stats import EngineCounters


def _rate(hit: float, total: float) -> float:
    return round(hit / total, 6) if total else 0.0


def _hits(counters: dict[str, float], flops_per_token: float) -> dict[str, Any]:
    query = counters.get("query_tokens", 0.0)
    hit = counters.get("hit_tokens", 0.0)
    tiers = {k.split(".", 1)[1]: v for k, v in counters.items() if k.startswith("hit_tokens.")}
    return {
        "query_tokens": int(query),
        "hit_tokens": int(hit),
        "hit_rate": _rate(hit, query),
        "hit_tokens_by_tier": {t: int(v) for t, v in sorted(tiers.items())},
        "hit_rate_by_tier": {t: _rate(v, query) for t, v in sorted(tiers.items())},
        "tokens_saved": int(hit),
        "compute_saved_flops": hit * flops_per_token,
        "evictions_by_tier": {
            k.split(".", 1)[1]: int(v)
            for k, v in sorted(counters.items())
            if k.startswith("evictions.")
        },
        "output_tokens": int(counters.get("output_tokens", 0.0)),
    }


def _namespaces(
    c: EngineCounters, window: dict[str, float], caller: Caller
) -> list[dict[str, Any]]:
    rows = []
    for key, ns in sorted(c.namespaces.items()):
        if not caller.owns_salt(ns.cache_salt):
            continue
        wq = window.get(f"ns.{key}.query_tokens", 0.0)
        wh = window.get(f"ns.{key}.hit_tokens", 0.0)
        rows.append(
            {
                "namespace": key,
                "cache_salt": ns.cache_salt,
                "query_tokens": ns.query_tokens,
                "hit_tokens": ns.hit_tokens,
                "hit_rate": _rate(ns.hit_tokens, ns.query_tokens),
                "window": {
                    "query_tokens": int(wq),
                    "hit_tokens": int(wh),
                    "hit_rate": _rate(wh, wq),
                },
            }
        )
    return rows


def cache_report(
    counters: EngineCounters,
    flat: dict[str, float],
    window: tuple[dict[str, float], float],
    window_minutes: float,
    started_at: float,
    flops_per_token: float,
    caller: Caller,
) -> dict[str, Any]:
    diff, covered = window
    report: dict[str, Any] = {
        "uptime_s": round(time.time() - started_at, 3),
        "since_start": _hits(flat, flops_per_token),
        "window": {
            "minutes": window_minutes,
            "covered_s": round(covered, 3),
            **_hits(diff, flops_per_token),
        },
        "namespaces": _namespaces(counters, diff, caller),
        "occupancy": {tier: asdict(o) for tier, o in counters.occupancy.items()},
        "requests": {"running": counters.running, "waiting": counters.waiting},
        "redis_nodes": counters.redis_nodes,
        "compute_saved_note": "flops ~ 2 x parameters x tokens saved (attention not counted)",
    }
    cache = counters.extra.get("cache")
    if cache is not None:
        report["device"] = {
            "block_size": cache.block_size,
            "num_blocks": cache.num_blocks,
            "free": cache.free,
            "evictable": cache.evictable,
            "referenced": cache.referenced,
            "pinned": cache.pinned,
            "cached": cache.cached,
            "policy": cache.policy,
        }
        curve = getattr(cache, "miss_ratio_curve", None)
        if curve:
            report["miss_ratio_curve"] = [asdict(p) for p in curve]
    return report
