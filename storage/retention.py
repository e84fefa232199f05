"""RetentionLedger: the blocks a persistent tier keeps past its ordinary eviction (a request's
`prompt_cache_retention`), each until a deadline, all within a byte budget.

Grants are kept in the order they were made (a renewal moves a block to the newest end). With one
duration per ledger that is also deadline order, so expiry pops from the oldest end; past the
budget the oldest grants lose their retention first (counted as dropped). Within one grant the
prefix's last block is ranked oldest and its first newest: a prefix cut by the budget keeps a
head that still loads (blocks chain: a load stops at the first missing one).

A block that loses its retention (dropped or expired) is not deleted: the tier takes it back as an
ordinary entry (disk: into its LRU; Redis: its key gets the ordinary TTL again, or simply runs out
at its own expiry). Thread-safe.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

RETAIN_S = 24 * 3600  # prompt_cache_retention "24h"


@dataclass
class RetentionStats:
    budget_bytes: int
    blocks: int = 0  # retained now
    bytes: int = 0
    granted: int = 0  # blocks given retention (renewals included)
    dropped: int = 0  # blocks whose retention ended early: past the budget, oldest first
    expired: int = 0  # blocks whose retention ran its full time


class RetentionLedger(Generic[K]):
    def __init__(
        self,
        budget_bytes: int,
        duration_s: float = RETAIN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.duration_s = duration_s
        self.stats = RetentionStats(budget_bytes)
        self._clock = clock
        self._lock = threading.Lock()
        self._held: OrderedDict[K, tuple[float, int]] = OrderedDict()  # key -> (deadline, size)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._held

    def __len__(self) -> int:
        return len(self._held)

    def size_of(self, key: K) -> int | None:
        with self._lock:
            held = self._held.get(key)
            return None if held is None else held[1]

    def grant(
        self, prefix: list[tuple[K, int]], duration_s: float | None = None
    ) -> list[tuple[K, int]]:
        """Retains a prefix's blocks (key, size), in prefix order, for duration_s (the ledger's
        by default) from now, renewing those already held; returns the blocks that lost their
        retention to make room (the oldest grants; blocks of this prefix too when it alone
        exceeds the budget). A shorter duration (a retention restored after a restart, which
        started earlier) must come before the newer grants, to keep deadline order."""
        deadline = self._clock() + (self.duration_s if duration_s is None else duration_s)
        with self._lock:
            for key, size in reversed(prefix):  # the head ends up newest (see above)
                self._pop(key)
                self._held[key] = (deadline, size)
                self.stats.blocks += 1
                self.stats.bytes += size
                self.stats.granted += 1
            dropped = []
            while self.stats.bytes > self.stats.budget_bytes and self._held:
                dropped.append(self._pop_oldest())
            self.stats.dropped += len(dropped)
            return dropped

    def expire(self) -> list[tuple[K, int]]:
        """Ends the retention of the blocks whose deadline has passed; those blocks."""
        now = self._clock()
        expired = []
        with self._lock:
            while self._held and next(iter(self._held.values()))[0] <= now:
                expired.append(self._pop_oldest())
            self.stats.expired += len(expired)
        return expired

    def drop_oldest(self) -> tuple[K, int] | None:
        """Ends the oldest retention early (its tier is out of room); None when none is held."""
        with self._lock:
            if not self._held:
                return None
            self.stats.dropped += 1
            return self._pop_oldest()

    def release(self, key: K) -> int | None:
        """The block is gone (deleted, corrupt): forget it; its size, None if it was not held."""
        with self._lock:
            return self._pop(key)

    def snapshot(self) -> RetentionStats:
        with self._lock:
            return RetentionStats(**vars(self.stats))

    def _pop_oldest(self) -> tuple[K, int]:
        key = next(iter(self._held))
        size = self._pop(key)
        assert size is not None
        return key, size

    def _pop(self, key: K) -> int | None:
        held = self._held.pop(key, None)
        if held is None:
            return None
        self.stats.blocks -= 1
        self.stats.bytes -= held[1]
        return held[1]
