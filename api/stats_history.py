"""Samples of cumulative counters over time, so rates can be given over the last N minutes."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    time: float
    counters: dict[str, float]


class StatsHistory:
    """A bounded series of counter samples; `delta` answers 'how much over the last W seconds'."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: deque[Sample] = deque()

    def record(self, time: float, counters: dict[str, float]) -> None:
        self._samples.append(Sample(time, dict(counters)))
        while len(self._samples) > 2 and self._samples[1].time < time - self.keep_s:
            self._samples.popleft()

    def start(self) -> Sample | None:
        return self._samples[0] if self._samples else None

    def delta(self, now: float, current: dict[str, float], window_s: float) -> tuple[dict, float]:
        """Counter increases since the newest sample at or before now - window_s (or the oldest).

        Returns (increases, covered seconds).
        """
        if not self._samples:
            return {k: 0.0 for k in current}, 0.0
        times = [s.time for s in self._samples]
        i = bisect.bisect_right(times, now - window_s) - 1
        base = self._samples[max(i, 0)]
        diff = {k: v - base.counters.get(k, 0.0) for k, v in current.items()}
        return diff, max(now - base.time, 0.0)
