"""Latency quantiles per interval: a cumulative histogram on fine log-spaced buckets (each 25%
wider than the last, 1 ms to ~10 min), so the difference of two snapshots gives the quantiles of
what was observed between them, in constant memory."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

GROWTH = 1.25
BOUNDS: tuple[float, ...] = tuple(0.001 * GROWTH**i for i in range(61))  # upper bucket bounds


@dataclass(frozen=True)
class LatencyCounts:
    """Observations per bucket (len(BOUNDS) + 1; the last one is beyond the largest bound)."""

    counts: tuple[int, ...] = (0,) * (len(BOUNDS) + 1)
    total_s: float = 0.0

    @property
    def count(self) -> int:
        return sum(self.counts)

    def minus(self, base: LatencyCounts) -> LatencyCounts:
        counts = tuple(a - b for a, b in zip(self.counts, base.counts, strict=True))
        return LatencyCounts(counts, self.total_s - base.total_s)

    def quantile(self, q: float) -> float | None:
        """The q-quantile, interpolated inside its bucket; None with no observation."""
        total = self.count
        if total <= 0:
            return None
        rank = q * total
        seen = 0
        for i, n in enumerate(self.counts):
            if n and seen + n >= rank:
                low = BOUNDS[i - 1] if i > 0 else 0.0
                high = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1]
                return low + (high - low) * max(0.0, rank - seen) / n
            seen += n
        return BOUNDS[-1]


class LatencyRecorder:
    """Observed on the event loop; `snapshot` may run on another thread (one list copy)."""

    def __init__(self) -> None:
        self._counts = [0] * (len(BOUNDS) + 1)
        self._total_s = 0.0

    def observe(self, seconds: float) -> None:
        self._counts[bisect.bisect_left(BOUNDS, seconds)] += 1
        self._total_s += seconds

    def snapshot(self) -> LatencyCounts:
        return LatencyCounts(tuple(self._counts), self._total_s)
