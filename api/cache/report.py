"""The /v1/cache/stats document: hit rates (overall, per tier, per namespace; since start and over
a recent window), tokens and compute saved, occupancy and evictions per tier. (The routes add the
counts per prompt_cache_key: api/observability/prompt_cache_keys.py.)"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

from api.auth import Caller
from api.observability.engine_stats import CacheCounters, EngineCounters, NamespaceCounters
from api.observability.pools import block_counts, layer_types_report
from engine.speculative.stats import SpecStats
from radixcache.shared.tier_names import TierName


def _rate(hit: float, total: float) -> float:
    return round(hit / total, 6) if total else 0.0


def _hits(c: CacheCounters, flops_per_token: float) -> dict[str, Any]:
    tiers = sorted(c.hit_tokens_by_tier.items())
    return {
        "query_tokens": c.query_tokens,
        "hit_tokens": c.hit_tokens,
        "hit_rate": _rate(c.hit_tokens, c.query_tokens),
        "hit_tokens_by_tier": dict(tiers),
        "hit_rate_by_tier": {t: _rate(v, c.query_tokens) for t, v in tiers},
        "tokens_saved": c.hit_tokens,
        "compute_saved_flops": c.hit_tokens * flops_per_token,
        "evictions_by_tier": dict(sorted(c.evictions_by_tier.items())),
        "output_tokens": c.output_tokens,
    }


def _namespaces(
    total: CacheCounters, window: CacheCounters, caller: Caller
) -> list[dict[str, Any]]:
    rows = []
    for key, ns in sorted(total.namespaces.items()):
        if not caller.owns_salt(ns.cache_salt):
            continue
        w = window.namespaces.get(key, NamespaceCounters(ns.cache_salt))
        rows.append(
            {
                "namespace": key,
                "cache_salt": ns.cache_salt,
                "query_tokens": ns.query_tokens,
                "hit_tokens": ns.hit_tokens,
                "hit_rate": _rate(ns.hit_tokens, ns.query_tokens),
                "window": {
                    "query_tokens": w.query_tokens,
                    "hit_tokens": w.hit_tokens,
                    "hit_rate": _rate(w.hit_tokens, w.query_tokens),
                },
            }
        )
    return rows


def spec_report(s: SpecStats) -> dict[str, Any]:
    """Speculative decoding: how many drafts the model agreed with, overall and by position."""
    return {
        "num_drafts": s.num_drafts,
        "num_draft_tokens": s.num_draft_tokens,
        "num_accepted_tokens": s.num_accepted_tokens,
        "acceptance_rate": round(s.acceptance_rate, 6),
        "mean_accepted_length": round(s.mean_accepted_length, 6),
        "accepted_per_pos": list(s.accepted_per_pos),
        "acceptance_per_pos": [round(r, 6) for r in s.acceptance_per_pos],
        "verify_step_ms": _mean_ms(s.verify_step_time, s.num_verify_steps),
        "plain_decode_step_ms": _mean_ms(s.plain_decode_step_time, s.num_plain_decode_steps),
    }


def _mean_ms(seconds: float, steps: int) -> float:
    return round(1000 * seconds / steps, 3) if steps else 0.0


def cache_report(
    counters: EngineCounters,
    window: tuple[CacheCounters, float],
    window_minutes: float,
    started_at: float,
    flops_per_token: float,
    caller: Caller,
) -> dict[str, Any]:
    diff, covered = window
    cache = counters.device
    report: dict[str, Any] = {
        "uptime_s": round(time.time() - started_at, 3),
        "since_start": _hits(counters.cache, flops_per_token),
        "window": {
            "minutes": window_minutes,
            "covered_s": round(covered, 3),
            **_hits(diff, flops_per_token),
        },
        "namespaces": _namespaces(counters.cache, diff, caller),
        "occupancy": {tier: asdict(o) for tier, o in counters.occupancy.items()},
        "requests": {"running": counters.running, "waiting": counters.waiting},
        "redis_nodes": counters.redis_nodes,
        "retention": None if counters.retention is None else asdict(counters.retention),
        "tier_traffic": None if counters.tier_traffic is None else asdict(counters.tier_traffic),
        "compute_saved_note": "flops ~ 2 x parameters x tokens saved (attention not counted)",
        TierName.DEVICE: {
            "block_size": cache.block_size,
            **block_counts(cache),
            "policy": cache.policy,
        },
    }
    report["speculative"] = spec_report(counters.spec)
    if cache.windows is not None:
        report["layer_types"] = layer_types_report(cache)
    if cache.miss_ratio_curve:
        report["miss_ratio_curve"] = [asdict(p) for p in cache.miss_ratio_curve]
    return report
