"""The /v1/cache/stats/history document: one point per interval of the sampled counters, each
with the token-weighted hit rate (overall and per tier), prompt tokens computed vs saved, TTFT
p50/p99, output tokens/s, the requests running / waiting, occupancy and evictions per tier."""

from __future__ import annotations

from typing import Any

from api.observability.engine_stats import TierOccupancy
from api.observability.server_counters import ServerCounters
from api.observability.stats_history import Sample


def _rate(hit: float, total: float) -> float | None:
    """None for an interval without lookups: it has no hit rate (a plot leaves a gap)."""
    return round(hit / total, 6) if total else None


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 6)


def _fill(occ: TierOccupancy) -> float | None:
    if occ.capacity_blocks:
        return _rate(occ.used_blocks or 0, occ.capacity_blocks)
    if occ.capacity_bytes:
        return _rate(occ.used_bytes or 0, occ.capacity_bytes)
    return None


def _point(start: float, end: float, diff: ServerCounters) -> dict[str, Any]:
    cache, span = diff.cache, max(end - start, 1e-9)
    return {
        "start": round(start, 3),
        "end": round(end, 3),
        "query_tokens": cache.query_tokens,
        "hit_tokens": cache.hit_tokens,
        "hit_rate": _rate(cache.hit_tokens, cache.query_tokens),
        "hit_rate_by_tier": {
            t: _rate(n, cache.query_tokens) for t, n in sorted(cache.hit_tokens_by_tier.items())
        },
        "tokens_saved": cache.hit_tokens,
        "tokens_computed": diff.computed_tokens,
        "requests_started": diff.ttft.count,
        "ttft_p50_s": _round(diff.ttft.quantile(0.5)),
        "ttft_p99_s": _round(diff.ttft.quantile(0.99)),
        "output_tokens_per_s": round(cache.output_tokens / span, 3),
        "running": diff.running,
        "waiting": diff.waiting,
        "occupancy": {t: _fill(o) for t, o in sorted(diff.occupancy.items())},
        "evictions_by_tier": dict(sorted(cache.evictions_by_tier.items())),
    }


def history_points(samples: list[Sample[ServerCounters]], step_s: float) -> list[dict[str, Any]]:
    """Differences of consecutive samples at least step_s apart (the first sample is the base)."""
    points: list[dict[str, Any]] = []
    if not samples:
        return points
    base = samples[0]
    for sample in samples[1:]:
        if sample.time - base.time < step_s * 0.999:  # tolerance for sampler jitter
            continue
        points.append(_point(base.time, sample.time, sample.counters.minus(base.counters)))
        base = sample
    return points
