"""The TieredStore's own counters and the typed snapshot it reports (per tier and overall)."""

from __future__ import annotations

from dataclasses import dataclass

from storage.base import TierStats
from storage.retention import RetentionStats


@dataclass
class StoreStats:
    stored_blocks: int = 0  # blocks handed to store() and queued
    dropped_blocks: int = 0  # blocks refused because the writer queue was full
    loads: int = 0  # loads that asked the tiers
    loaded_blocks: int = 0
    deadline_misses: int = 0  # loads taken before they were done (the deadline passed)
    load_errors: int = 0  # loads cut short by an unexpected tier exception


@dataclass(frozen=True)
class TierSnapshot:
    stats: TierStats  # a copy
    used_bytes: int
    capacity_bytes: int | None  # None: no budget of ours (Redis evicts by TTL / maxmemory)


@dataclass(frozen=True)
class StoreSnapshot:
    tiers: dict[str, TierSnapshot]  # by tier name, fastest first
    store: StoreStats  # a copy
    pending_blocks: int  # queued for the writer thread, not yet written
    # the persistent tier's name and its retained prefixes (None: no persistent tier)
    retention: tuple[str, RetentionStats] | None = None
