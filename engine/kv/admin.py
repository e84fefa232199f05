"""Cache administration as typed operations: the one path from the API (through the AsyncEngine's
engine thread) or the offline LLM to the KV cache. `engine.admin(Lookup(ids))` returns what
Lookup says it returns; every operation runs on the engine's thread."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

if TYPE_CHECKING:
    from engine.kv.manager import KVCacheManager
    from engine.request import Sequence
    from radixcache.hashing import Namespace
    from radixcache.stats import CacheStats, PrefixInfo

T = TypeVar("T")


class CacheAdmin:
    """What the operations act on: the manager (only its verbs), and the engine's namespace
    (a tenant's is it with the tenant's cache_salt)."""

    def __init__(
        self,
        kv: KVCacheManager,
        namespace: Namespace,
        holders: Callable[[], list[Sequence]] = list,
    ) -> None:
        """`holders`: the sequences that may hold blocks now (what the integrity check counts)."""
        self.kv = kv
        self.namespace = namespace
        self.holders = holders

    def run(self, op: AdminOp[T]) -> T:
        return op.apply(self)

    def namespace_for(self, cache_salt: str) -> Namespace:
        return self.namespace.with_salt(cache_salt)

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
        return admin.kv.lookup(admin.namespace_for(self.cache_salt), self.token_ids)


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
        return admin.kv.pin(admin.namespace_for(self.cache_salt), self.token_ids)


@dataclass(frozen=True)
class Unpin(AdminOp[int]):
    """Undoes one earlier pin of the same tokens; tokens unpinned."""

    token_ids: list[int]
    cache_salt: str = ""

    def apply(self, admin: CacheAdmin) -> int:
        return admin.kv.unpin(admin.namespace_for(self.cache_salt), self.token_ids)


@dataclass(frozen=True)
class HottestPrefixes(AdminOp["list[PrefixInfo]"]):
    """The most-hit cached prefixes (of the salt's tenant, or all)."""

    limit: int = 10
    cache_salt: str | None = None

    def apply(self, admin: CacheAdmin) -> list[PrefixInfo]:
        return admin.kv.hottest_prefixes(self.limit, admin.ns(self.cache_salt))


@dataclass(frozen=True)
class CacheStatsOp(AdminOp["CacheStats"]):
    """The device pool's occupancy and per-namespace counters."""

    def apply(self, admin: CacheAdmin) -> CacheStats:
        return admin.kv.stats()


@dataclass(frozen=True)
class CheckIntegrity(AdminOp[None]):
    """Raises IntegrityError on a leaked block or a broken invariant of the cache."""

    def apply(self, admin: CacheAdmin) -> None:
        admin.kv.check_integrity(admin.holders())
