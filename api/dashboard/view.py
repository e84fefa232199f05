"""What the dashboard shows beyond /v1/cache/stats: hit rates per tenant, the hottest prefixes the
caller may see, and a one-line sizing advice read off the miss-ratio curve."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from api.auth import TENANT_PREFIX, Caller
from api.engine_stats import CacheCounters
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
    device = total.hit_tokens_by_tier.get("device", 0)
    return device / total.query_tokens if total.query_tokens else None


def owned_salts(total: CacheCounters, caller: Caller) -> list[str]:
    return sorted(
        {ns.cache_salt for ns in total.namespaces.values() if caller.owns_salt(ns.cache_salt)}
    )


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


def sizing_advice(curve: list[MissRatioPoint], measured: float | None = None) -> str:
    """One line: what doubling (or halving) the device pool would do to the hit rate.

    `measured`: the device pool's own hit rate; a curve far from it at 1x has sampled too few
    lookups to advise on (it samples one block in 256 at 16 tokens a block)."""
    now, double, half = _at(curve, 1.0), _at(curve, 2.0), _at(curve, 0.5)
    if now is None or double is None:
        return "No miss-ratio curve yet: it needs cache lookups (or sampling is off)."
    if measured is not None and abs(now.hit_rate - measured) > MAX_CURVE_ERROR:
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
