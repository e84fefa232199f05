"""What the dashboard shows beyond /v1/cache/stats: hit rates per tenant, the hottest prefixes the
caller may see, and a one-line sizing advice read off the miss-ratio curve."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.auth import TENANT_PREFIX, Caller
from api.observability.engine_stats import CacheCounters, TierOccupancy
from radixcache.shared.tier_names import TierName
from radixcache.stats import MissRatioPoint, PrefixInfo

NO_TENANT = "(no tenant)"
MAX_CURVE_ERROR = 0.2  # |curve at 1x - measured device hit rate| beyond which we do not advise


def tenant_of_salt(salt: str) -> str:
    """The tenant whose requests run under this cache salt ('tenant:alice|x' -> 'alice')."""
    if not salt.startswith(TENANT_PREFIX):
        return NO_TENANT
    return salt[len(TENANT_PREFIX) :].split("|", 1)[0]


@dataclass
class _Tally:
    query: int = 0
    hit: int = 0
    window_query: int = 0
    window_hit: int = 0


def _rate(hit: int, total: int) -> float:
    return round(hit / total, 6) if total else 0.0


def tenant_rows(total: CacheCounters, window: CacheCounters, caller: Caller) -> list[dict]:
    """Token-weighted hit rates per tenant (since start and over the window), of the namespaces
    the caller owns (the admin: all). The engine counts namespaces' hits in the device pool only."""
    tallies: dict[str, _Tally] = {}
    for key, ns in total.namespaces.items():
        if not caller.owns_salt(ns.cache_salt):
            continue
        t = tallies.setdefault(tenant_of_salt(ns.cache_salt), _Tally())
        t.query += ns.query_tokens
        t.hit += ns.hit_tokens
        w = window.namespaces.get(key)
        if w is not None:
            t.window_query += w.query_tokens
            t.window_hit += w.hit_tokens
    return [
        {
            "tenant": name,
            "query_tokens": t.query,
            "hit_tokens": t.hit,
            "hit_rate": _rate(t.hit, t.query),
            "window_hit_rate": _rate(t.window_hit, t.window_query),
        }
        for name, t in sorted(tallies.items())
    ]


def device_hit_rate(total: CacheCounters) -> float | None:
    device = total.hit_tokens_by_tier.get(TierName.DEVICE, 0)
    return device / total.query_tokens if total.query_tokens else None


def owned_salts(total: CacheCounters, caller: Caller, most: int = 16) -> list[str]:
    """The caller's busiest cache salts (one engine walk each: a tenant's many salts stay cheap)."""
    queried: dict[str, int] = {}
    for ns in total.namespaces.values():
        if caller.owns_salt(ns.cache_salt):
            queried[ns.cache_salt] = queried.get(ns.cache_salt, 0) + ns.query_tokens
    return sorted(queried, key=lambda salt: (-queried[salt], salt))[:most]


def hottest(rows: list[PrefixInfo], limit: int) -> list[PrefixInfo]:
    rows = sorted(rows, key=lambda i: (i.hits, i.num_tokens), reverse=True)
    return rows[:limit]


def prefix_row(tok: Any, info: PrefixInfo, caller: Caller) -> dict[str, Any]:
    row: dict[str, Any] = {
        "tenant": tenant_of_salt(info.namespace.cache_salt),
        "preview": tok.decode(list(info.token_ids)),
        "num_tokens": info.num_tokens,
        "hits": info.hits,
        "tokens_saved": info.tokens_saved,
        "pinned": info.pinned,
        "last_used": (
            datetime.fromtimestamp(info.last_used, UTC).isoformat() if info.last_used > 0 else None
        ),
    }
    if caller.is_admin:  # what /v1/cache/pin needs; pins the preview's tokens
        row["cache_salt"] = info.namespace.cache_salt
        row["pin_tokens"] = list(info.token_ids)
        row["pins_whole_prefix"] = len(info.token_ids) >= info.num_tokens
    return row


def _at(curve: list[MissRatioPoint], ratio: float) -> MissRatioPoint | None:
    return next((p for p in curve if abs(p.size_ratio - ratio) < 1e-9), None)


def _trusted(curve: list[MissRatioPoint], measured: float | None) -> bool:
    now = _at(curve, 1.0)
    return measured is None or now is None or abs(now.hit_rate - measured) <= MAX_CURVE_ERROR


def sizing_advice(curve: list[MissRatioPoint], measured: float | None = None) -> str:
    """One line: what doubling (or halving) the device pool would do to the hit rate.

    `measured`: the device pool's own hit rate; a curve far from it at 1x has sampled too few
    lookups to advise on (it samples one block in 256 at 16 tokens a block)."""
    now, double, half = _at(curve, 1.0), _at(curve, 2.0), _at(curve, 0.5)
    if now is None or double is None:
        return "No miss-ratio curve yet: it needs cache lookups (or sampling is off)."
    if not _trusted(curve, measured):
        return (
            f"Too few sampled lookups for sizing advice yet: the curve estimates "
            f"{now.hit_rate:.2f} at this size, the pool measured {measured:.2f}."
        )
    gain = double.hit_rate - now.hit_rate
    if gain >= 0.01:
        return (
            f"Doubling the pool ({now.size_blocks} -> {double.size_blocks} blocks) would raise "
            f"the hit rate from {now.hit_rate:.2f} to {double.hit_rate:.2f}."
        )
    if half is not None and now.hit_rate - half.hit_rate < 0.01:
        return (
            f"The pool is larger than the working set: halving it ({now.size_blocks} -> "
            f"{half.size_blocks} blocks) would keep the hit rate at {half.hit_rate:.2f}."
        )
    return (
        f"The pool is large enough: doubling it would change the hit rate by less than 0.01 "
        f"(now {now.hit_rate:.2f})."
    )


def _interpolate(curve: list[MissRatioPoint], ratio: float) -> float:
    """The curve's hit rate at `ratio` (linear in log size between its points)."""
    below = max((p for p in curve if p.size_ratio <= ratio), key=lambda p: p.size_ratio)
    above = min((p for p in curve if p.size_ratio >= ratio), key=lambda p: p.size_ratio)
    if above.size_ratio == below.size_ratio:
        return below.hit_rate
    t = math.log(ratio / below.size_ratio) / math.log(above.size_ratio / below.size_ratio)
    return below.hit_rate + t * (above.hit_rate - below.hit_rate)


def spill_estimate(
    curve: list[MissRatioPoint],
    occupancy: dict[str, TierOccupancy],
    measured: float | None = None,
) -> dict[str, Any] | None:
    """The hit rate the curve estimates for the device pool plus the spill tiers' budgets (the
    tiers take what the pool evicts, so together they behave about like one larger LRU cache)."""
    device = occupancy.get(TierName.DEVICE)
    spill = {t: o for t, o in occupancy.items() if t != TierName.DEVICE}
    if not curve or device is None or not device.capacity_blocks or not spill:
        return None
    if not _trusted(curve, measured):
        return {"line": "No estimate across the spill tiers until the curve has more samples."}
    blocks: dict[str, int] = {}
    for tier, occ in sorted(spill.items()):
        if occ.capacity_bytes is None:
            return {"line": f"The {tier} tier has no budget of ours: no estimate across tiers."}
        if not occ.block_bytes:
            return {"line": "The spill tiers have stored no block yet: no estimate across tiers."}
        blocks[tier] = occ.capacity_bytes // occ.block_bytes
    total = device.capacity_blocks + sum(blocks.values())
    ratio = total / device.capacity_blocks
    parts = ", ".join(f"{t} {n} blocks" for t, n in blocks.items())
    largest = max(curve, key=lambda p: p.size_ratio)
    if ratio > largest.size_ratio:
        return {
            "size_ratio": largest.size_ratio,
            "hit_rate": largest.hit_rate,
            "line": (
                f"With the spill tiers ({parts}) the cache holds {ratio:.1f}x the pool, beyond "
                f"the curve: at least {largest.hit_rate:.2f} (its {largest.size_ratio:g}x estimate)."
            ),
        }
    rate = _interpolate(curve, ratio)
    return {
        "size_ratio": round(ratio, 4),
        "hit_rate": round(rate, 6),
        "line": (
            f"With the spill tiers ({parts}) the cache holds {ratio:.1f}x the pool: "
            f"estimated hit rate {rate:.2f}."
        ),
    }
