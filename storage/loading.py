"""Helpers of the TieredStore's loads: find the leading run across tiers, collect loaded blocks."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch

from storage.base import Tier

if TYPE_CHECKING:
    from radixcache.hashing import Namespace


def leading_run(
    tiers: list[Tier], ns: Namespace, hashes: list[int], *, count_misses: bool
) -> list[int]:
    """Index of the fastest tier holding each block of the longest leading run of `hashes`
    found in some tier (hashes are chained, so only a leading run is usable)."""
    where = [-1] * len(hashes)
    for t, tier in enumerate(tiers):
        ask = [i for i, w in enumerate(where) if w < 0]
        if not ask:
            break
        found = tier.contains(ns, [hashes[i] for i in ask])
        for i, has in zip(ask, found, strict=True):
            if has:
                where[i] = t
        if count_misses:
            tier.stats.misses += found.count(False)
    run = next((i for i, w in enumerate(where) if w < 0), len(where))
    return where[:run]


def segments(where: list[int], size: int) -> Iterator[tuple[int, int, int]]:
    """(tier, start, end) for consecutive blocks in the same tier, at most `size` long (one
    tier.get call each: the loader checks for cancellation and its pace between calls)."""
    start = 0
    for i in range(1, len(where) + 1):
        if i == len(where) or where[i] != where[start] or i - start == size:
            yield where[start], start, i
            start = i


class LoadJob:
    """Shared between the engine thread (waits, then finish()) and the loader thread (add())."""

    def __init__(
        self, ns: Namespace, hashes: list[int], shape: tuple[int, ...] | None, deadline: float
    ) -> None:
        self.ns, self.hashes, self.shape = ns, hashes, shape
        self.deadline = deadline  # time.monotonic() after which the engine stops waiting
        self.cancelled = False
        self._names: list[str] = []
        self._blocks: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def add(self, tier_name: str, block: torch.Tensor) -> bool:
        """Append the next block of the run; False once the engine has stopped waiting."""
        with self._lock:
            if self.cancelled:
                return False
            self._names.append(tier_name)
            self._blocks.append(block)
            return True

    def finish(self) -> tuple[list[str], list[torch.Tensor]]:
        """Stop the loader (if still running) and take what it loaded so far."""
        with self._lock:
            self.cancelled = True
            return list(self._names), list(self._blocks)
