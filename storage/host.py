"""HostTier: encoded blocks in CPU RAM under a byte budget, least recently used dropped first."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from radixcache.shared.tier_names import TierName
from storage.base import SpillDown, TierStats

if TYPE_CHECKING:
    from radixcache.hashing import Namespace


class HostTier:
    """Values live in memory as they were written (this process encoded them), so get() does not
    re-verify checksums. Thread-safe: the store's writer and loader threads share it.

    How a value is kept is up to four hooks (_fits, _keep, _value, _drop): here the bytes
    themselves; storage/pinned_host.py keeps them in slots of one pinned arena."""

    name = TierName.HOST

    def __init__(self, capacity_bytes: int, spill_down: SpillDown | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.spill_down = spill_down
        self.stats = TierStats()
        # (namespace hex, block hash) -> (namespace, kept value, bytes); order = LRU first
        self._entries: OrderedDict[tuple[str, int], tuple[Namespace, Any, int]] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()

    def contains(self, ns: Namespace, hashes: list[int]) -> list[bool]:
        nsx = ns.hex
        with self._lock:
            return [(nsx, h) in self._entries for h in hashes]

    def get(self, ns: Namespace, hashes: list[int]) -> list[bytes | None]:
        nsx, out = ns.hex, []
        with self._lock:
            for h in hashes:
                entry = self._entries.get((nsx, h))
                if entry is not None:
                    self._entries.move_to_end((nsx, h))
                    self.stats.bytes_read += entry[2]
                out.append(None if entry is None else self._value(entry[1]))
        return out

    def put(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        evicted: list[tuple[Namespace, int, bytes]] = []
        with self._lock:
            for h, value in items:
                key = (ns.hex, h)
                if key in self._entries:
                    self._entries.move_to_end(key)
                    continue
                if not self._fits(len(value)):
                    self.stats.rejected_writes += 1
                    continue
                evicted += self._make_room(len(value))
                self._entries[key] = (ns, self._keep(value), len(value))
                self._used += len(value)
                self.stats.bytes_written += len(value)
                self.stats.blocks_written += 1
        self._spill(evicted)

    def delete(self, ns: Namespace, hashes: list[int]) -> None:
        with self._lock:
            for h in hashes:
                self._forget((ns.hex, h))

    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        with self._lock:
            self._entries.clear()
            self._used = 0

    # --- how a value is kept ---
    def _fits(self, size: int) -> bool:
        return size <= self.capacity_bytes

    def _keep(self, value: bytes) -> Any:
        return value

    def _value(self, kept: Any) -> bytes:
        return kept

    def _drop(self, kept: Any) -> None:
        """The entry is gone (evicted, deleted): its memory may be reused."""

    def _forget(self, key: tuple[str, int]) -> None:
        """Drops an entry, if held (the lock held)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._used -= entry[2]
            self._drop(entry[1])

    def _make_room(self, size: int) -> list[tuple[Namespace, int, bytes]]:
        evicted = []
        while self._used + size > self.capacity_bytes and self._entries:
            key = next(iter(self._entries))  # the least recently used
            ns, kept, _ = self._entries[key]
            evicted.append((ns, key[1], self._value(kept)))
            self._forget(key)
            self.stats.evictions += 1
        return evicted

    def _spill(self, evicted: list[tuple[Namespace, int, bytes]]) -> None:
        if self.spill_down is None or not evicted:
            return
        by_ns: dict[str, tuple[Namespace, list[tuple[int, bytes]]]] = {}
        for ns, h, value in evicted:
            by_ns.setdefault(ns.hex, (ns, []))[1].append((h, value))
        for ns, items in by_ns.values():
            self.spill_down(ns, items)
