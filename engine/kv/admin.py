"""Cache administration as typed operations: the one path from the API (through the AsyncEngine's
engine thread) or the offline LLM to the KV cache. `engine.admin(Lookup(ids))` returns what
Lookup says it returns; every operation runs on the engine's thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from radixcache.hashing import block_hashes
from radixcache.tier_names import SPILL_TIERS, TierName

if TYPE_CHECKING:
    from engine.kv.manager import KVCacheManager
    from engine.request import Sequence
    from radixcache.hashing import Namespace
    from radixcache.stats import CacheStats, PrefixInfo

T = TypeVar("T")


class CacheAdmin:
    """What the operations act on: the manager, and the engine's tenant namespaces."""

    def __init__(
        self,
        kv: KVCacheManager,
        namespace_for: Callable[[str], Namespace],
        holders: Callable[[], list[Sequence]] = list,
    ) -> None:
        """`holders`: the sequences that may hold blocks now (what the integrity check counts)."""
        self.kv = kv
        self.namespace_for = namespace_for
        self.holders = holders

    def run(self, op: AdminOp[T]) -> T:
        return op.apply(self)

    def ns(self, cache_salt: str | None) -> Namespace | None:
        return None if cache_salt is None else self.namespace_for(cache_salt)


class AdminOp(Generic[T]):
    def apply(self, admin: CacheAdmin) -> T:
        raise NotImplementedError


@dataclass(frozen=True)
class Lookup(AdminOp[dict[str, int]]):
    """Tokens of this prompt's prefix cached per tier, without running or locking it."""

    token_ids: list[int]
    cache_salt: str = ""

    def apply(self, admin: CacheAdmin) -> dict[str, int]:
        kv, ns = admin.kv, admin.namespace_for(self.cache_salt)
        match = kv.cache.peek(ns, self.token_ids)
        found = {TierName.DEVICE: match.num_tokens, **dict.fromkeys(SPILL_TIERS, 0)}
        bs, start = kv.block_size, match.num_tokens
        end = len(self.token_ids) // bs * bs
        if kv.tiers is not None and end > start:
            hashes = block_hashes(ns, self.token_ids[start:end], parent_hash=match.last_hash)
            found.update(kv.tiers.lookup(ns, hashes))
        return found


@dataclass(frozen=True)
class Flush(AdminOp[int]):
    """Evicts every unreferenced cached block (of the salt's tenant, or all), spilling it to the
    tiers; returns the blocks evicted."""

    cache_salt: str | None = None

    def apply(self, admin: CacheAdmin) -> int:
        return admin.kv.flush(admin.ns(self.cache_salt))


@dataclass(frozen=True)
class Pin(AdminOp[int]):
    """Pins the cached prefix of `token_ids` (capped by max_pinned_fraction); tokens pinned."""

    token_ids: list[int]
    cache_salt: str = ""

    def apply(self, admin: CacheAdmin) -> int:
        return admin.kv.cache.pin(admin.namespace_for(self.cache_salt), self.token_ids)


@dataclass(frozen=True)
class Unpin(AdminOp[int]):
    """Undoes one earlier pin of the same tokens; tokens unpinned."""

    token_ids: list[int]
    cache_salt: str = ""

    def apply(self, admin: CacheAdmin) -> int:
        return admin.kv.cache.unpin(admin.namespace_for(self.cache_salt), self.token_ids)


@dataclass(frozen=True)
class HottestPrefixes(AdminOp["list[PrefixInfo]"]):
    """The most-hit cached prefixes (of the salt's tenant, or all)."""

    limit: int = 10
    cache_salt: str | None = None

    def apply(self, admin: CacheAdmin) -> list[PrefixInfo]:
        return admin.kv.cache.hottest_prefixes(self.limit, admin.ns(self.cache_salt))


@dataclass(frozen=True)
class CacheStatsOp(AdminOp["CacheStats"]):
    """The device pool's occupancy and per-namespace counters."""

    def apply(self, admin: CacheAdmin) -> CacheStats:
        return admin.kv.cache.stats()


@dataclass(frozen=True)
class CheckIntegrity(AdminOp[None]):
    """Raises IntegrityError on a leaked block or a broken invariant of the cache."""

    def apply(self, admin: CacheAdmin) -> None:
        admin.kv.check_integrity(admin.holders())
