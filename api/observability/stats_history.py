"""Samples of cumulative counters over time, so rates can be given over the last N minutes and
per interval (the dashboard's history)."""

from __future__ import annotations

import bisect
import math
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
    """A bounded ring of counter samples: at most `max_samples`, none older than keep_s (except
    the one sample a window needs as its base). `delta` answers 'how much over the last W
    seconds'; `since` hands the samples of a range, whose differences are per-interval stats."""

    def __init__(self, keep_s: float, interval_s: float | None = None) -> None:
        self.keep_s = keep_s
        self.interval_s = interval_s
        # two spare slots: the base of the oldest interval, and a sample taken out of turn
        self.max_samples = 2 + (math.ceil(keep_s / interval_s) if interval_s else 100_000)
        self._samples: deque[Sample[C]] = deque(maxlen=self.max_samples)

    def __len__(self) -> int:
        return len(self._samples)

    def record(self, time: float, counters: C) -> None:
        self._samples.append(Sample(time, counters))
        while len(self._samples) > 2 and self._samples[1].time < time - self.keep_s:
            self._samples.popleft()

    def start(self) -> Sample[C] | None:
        return self._samples[0] if self._samples else None

    def base(self, now: float, window_s: float) -> Sample[C] | None:
        """The newest sample at or before now - window_s (or the oldest one)."""
        if not self._samples:
            return None
        times = [s.time for s in self._samples]
        i = bisect.bisect_right(times, now - window_s) - 1
        return self._samples[max(i, 0)]

    def delta(self, now: float, current: C, window_s: float) -> tuple[C, float]:
        """Counter increases since base(now, window_s).

        Returns (increases, covered seconds); with no sample yet, zero increases over 0 s.
        """
        base = self.base(now, window_s)
        if base is None:
            return current.minus(current), 0.0
        return current.minus(base.counters), max(now - base.time, 0.0)

    def since(self, start: float) -> list[Sample[C]]:
        """The samples after `start`, preceded by the newest one at or before it (their base)."""
        samples = list(self._samples)
        times = [s.time for s in samples]
        i = bisect.bisect_right(times, start) - 1
        return samples[max(i, 0) :]
