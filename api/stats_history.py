"""Samples of cumulative counters over time, so rates can be given over the last N minutes."""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

C = TypeVar("C", bound="Cumulative")


class Cumulative(Protocol):
    def minus(self: C, base: C) -> C: ...


@dataclass(frozen=True)
class Sample(Generic[C]):
    time: float
    counters: C


class StatsHistory(Generic[C]):
    """A bounded series of counter samples; `delta` answers 'how much over the last W seconds'."""

    def __init__(self, keep_s: float) -> None:
        self.keep_s = keep_s
        self._samples: deque[Sample[C]] = deque()

    def record(self, time: float, counters: C) -> None:
        self._samples.append(Sample(time, counters))
        while len(self._samples) > 2 and self._samples[1].time < time - self.keep_s:
            self._samples.popleft()

    def start(self) -> Sample[C] | None:
        return self._samples[0] if self._samples else None

    def delta(self, now: float, current: C, window_s: float) -> tuple[C, float]:
        """Counter increases since the newest sample at or before now - window_s (or the oldest).

        Returns (increases, covered seconds); with no sample yet, zero increases over 0 s.
        """
        if not self._samples:
            return current.minus(current), 0.0
        times = [s.time for s in self._samples]
        i = bisect.bisect_right(times, now - window_s) - 1
        base = self._samples[max(i, 0)]
        return current.minus(base.counters), max(now - base.time, 0.0)
