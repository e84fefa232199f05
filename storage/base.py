"""The interface every spill tier implements, and the counters each one keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixcache.hashing import Namespace
    from storage.retention import RetentionStats

# Called with the blocks a tier dropped to stay within its budget (write-back spills them lower).
SpillDown = Callable[["Namespace", list[tuple[int, bytes]]], None]


@dataclass
class TierStats:
    """Plain counters; a tier updates its own I/O fields, the TieredStore the lookup fields."""

    hits: int = 0  # blocks loaded from this tier (start_load / load_prefix)
    hit_tokens: int = 0
    misses: int = 0  # blocks a load asked this tier for and it lacked
    bytes_read: int = 0
    bytes_written: int = 0
    blocks_written: int = 0
    evictions: int = 0  # blocks dropped to stay within the byte budget
    errors: int = 0  # I/O or connection failures
    corrupt: int = 0  # values that failed the codec check (discarded)
    rejected_writes: int = 0  # writes refused: value over budget, disk full, breaker open
    breaker_opens: int = 0  # times the tier was taken out of service after a failure
    skipped_calls: int = 0  # calls answered as misses while the tier was out of service
    load_time_s: float = 0.0  # time spent in get() on behalf of loads

    def snapshot(self) -> dict[str, float]:
        return asdict(self)


class Tier(Protocol):
    """Batch operations by chained block hash within a namespace. Values are encoded blocks
    (storage.codec). get() returns only values that passed the codec check; a tier that finds a
    corrupt value deletes it, counts it in stats.corrupt and reports a miss."""

    name: str
    stats: TierStats
    spill_down: SpillDown | None

    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]: ...

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]: ...

    def put(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None: ...

    def delete(self, ns: Namespace, hashes: list[int]) -> None: ...

    def used_bytes(self) -> int: ...

    def close(self) -> None: ...


class RetainingTier(Tier, Protocol):
    """A persistent tier (disk, Redis): keeps a request's prefix past its ordinary eviction, for a
    while and within a budget (storage/retention.py)."""

    def retain(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None: ...

    def retention_stats(self) -> RetentionStats: ...


def block_key(ns: Namespace, block_hash: int) -> str:
    """`<namespace hex>:<block hash hex>`; tiers prepend their own prefix."""
    return f"{ns.hex}:{block_hash:016x}"
