"""Online miss-ratio curve: SHARDS-style spatially sampled LRU reuse distances of block hashes.

A block is sampled when its (uniformly distributed) 64-bit chained hash falls under rate * 2**64,
so every reference to it is seen or none is. For a sampled reference the number of
distinct sampled blocks referenced since its previous reference, divided by the rate, estimates
its LRU stack distance; an LRU cache of C blocks hits exactly the references with distance < C.
In an LRU radix tree a parent is never less recent than its children, so block-level stack
distances also describe the tree. Cost: O(log n) per *sampled* reference only.

The tree does not hash every block for this (block hashes are computed lazily): it keys
sampling *units*, every `unit_blocks`-th block of a chain (at most 64 tokens apart), by a cheap
in-process chain over the units' tokens, and samples a unit with probability rate * unit_blocks,
so a share `rate` of the blocks is still sampled. Blocks of one path a few tokens apart are
reused together, so sampling one block per unit changes the estimate little; a unit costs one
xxh3 of its <= 64 tokens' bytes, not one per block.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence

import xxhash
from sortedcontainers import SortedList

DEFAULT_RATIOS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0)
UNIT_TOKENS = 64
_xxh3 = xxhash.xxh3_64_intdigest


def unit_blocks(sample_rate: float, block_size: int) -> int:
    """Blocks per sampling unit: up to UNIT_TOKENS tokens, and at most 1 / rate blocks."""
    return max(1, min(int(1 / sample_rate), UNIT_TOKENS // block_size))


def unit_keys(prev: int, tokens: array, start: int, end: int, size: int) -> list[int]:
    """Chained keys of the units tokens[start:end] of an array("q") (`size` tokens each;
    `prev`: the key of the unit before, or the namespace seed): xxh3_64 of the unit's bytes,
    seeded by the key before (deterministic, in-process keys only: never stored)."""
    data = memoryview(tokens[start:end].tobytes())
    step = size * tokens.itemsize
    keys = []
    for off in range(0, len(data), step):
        prev = _xxh3(data[off : off + step], prev)
        keys.append(prev)
    return keys


class MissRatioCurve:
    """Reuse-distance histogram of sampled block references."""

    def __init__(self, sample_rate: float = 1 / 32, max_blocks: int | None = None) -> None:
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        self.rate = sample_rate
        self.threshold = int(sample_rate * 2**64)
        # tracked sampled blocks; distances beyond max_blocks count as misses anyway
        self.max_tracked = None if max_blocks is None else int(max_blocks * sample_rate) + 1
        self.clock = 0
        self.last: dict[int, int] = {}  # sampled block hash -> time of its last reference
        self.times = SortedList()  # the values of `last`
        self.owner: dict[int, int] = {}  # time -> the hash referenced then
        self.distances: dict[int, int] = {}  # sampled stack distance -> references
        self.references = 0  # sampled references, hits and misses
        self.total = 0  # all block references, sampled or not (for the SHARDS_adj correction)
        # sampled references not yet counted: the request path only appends (one C call); the
        # O(log n) bookkeeping runs when the curve is read or this many are waiting
        self.pending: list[int] = []
        self.max_pending = 4096

    def unit_threshold(self, blocks_per_unit: int) -> int:
        """Keys under this are sampled: a unit stands for `blocks_per_unit` blocks."""
        return int(min(1.0, self.rate * blocks_per_unit) * 2**64)

    def sample(self, hashes: Iterable[int]) -> tuple[int, ...]:
        """The hashes of `hashes` that are sampled (computed once per node, at insert)."""
        hashes = tuple(hashes)
        if not hashes or min(hashes) >= self.threshold:  # most nodes: one C loop, no sample
            return ()
        return tuple(filter(self.threshold.__gt__, hashes))

    def reference(self, sampled: Sequence[int]) -> None:
        """Record references to these sampled hashes (shallowest first)."""
        self.pending += reversed(sampled)  # deeper blocks end up less recent, as the tree evicts
        if len(self.pending) > self.max_pending:
            self.drain()

    def drain(self) -> None:
        """Count the pending references, in the order they were made."""
        pending, self.pending = self.pending, []
        for h in pending:
            self._reference(h)

    def _reference(self, h: int) -> None:
        self.references += 1
        distances = self.distances
        t0 = self.last.get(h)
        if t0 is not None and t0 == self.clock:  # referenced last too: distance 0, order kept
            distances[0] = distances.get(0, 0) + 1
            return
        self.clock += 1
        if t0 is not None:
            d = len(self.times) - self.times.bisect_right(t0)
            distances[d] = distances.get(d, 0) + 1
            self.times.remove(t0)
            del self.owner[t0]
        self.last[h] = self.clock
        self.owner[self.clock] = h
        self.times.add(self.clock)
        if self.max_tracked is not None and len(self.times) > self.max_tracked:
            del self.last[self.owner.pop(self.times.pop(0))]

    def hit_rate(self, size_blocks: int) -> float:
        """Estimated LRU block hit rate at `size_blocks`."""
        self.drain()
        # SHARDS_adj: the gap between the expected and the actual number of sampled references
        # (mostly a few very hot blocks that the sample caught or missed) counts as hits at
        # distance 0, and rates are taken over the expected number.
        expected = self.rate * self.total if self.total else self.references
        if expected <= 0:
            return 0.0
        limit = size_blocks * self.rate
        hits = sum(n for d, n in self.distances.items() if d < limit)
        hits += expected - self.references
        return min(1.0, max(0.0, hits / expected))

    def curve(self, num_blocks: int, ratios: Sequence[float] = DEFAULT_RATIOS) -> list[tuple]:
        """(size in blocks, size / num_blocks, estimated hit rate) at each ratio."""
        return [(int(r * num_blocks), r, self.hit_rate(int(r * num_blocks))) for r in ratios]
