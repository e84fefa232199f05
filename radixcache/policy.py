"""Eviction policies: each gives a node a priority; the lowest evictable leaf goes first.

The tree keeps the unreferenced, unpinned leaves in one ordered set keyed by
(node.evict_prio, node.id) and asks the policy to set `node.prio` (and, if it likes,
`node.tail_prio`: the price of the node's last block until that block is read or evicted) at the
moments below; priorities never change otherwise, so every policy costs O(log n) per access and
per evicted leaf.

Policies: "lru" (the default), "freq-ageing" (GreedyDual on use counts) and "learned"
(GreedyDual on a reuse probability learned per class of block, radixcache/policy_learned.py).
On the Mooncake trace "learned" beats LRU at small pools (1-10% of the unique blocks) and on every
synthetic workload of benchmarks/bench_policy.py, but falls slightly below LRU at 20-40%, where
LRU is within 0.02 of the unlimited ceiling; so LRU stays the default.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol

from radixcache.policy_learned import LearnedReusePolicy

if TYPE_CHECKING:
    from radixcache.radix_node import Node


class EvictionPolicy(Protocol):
    name: str
    uses_hashes: bool  # reads node.hashes: the tree then hashes every block at insert

    def attach(self, num_blocks: int) -> None:
        """Called once by the cache with the pool size."""

    def on_insert(self, node: Node, tick: int) -> None:
        """`node` was just created holding new blocks (`node.hashes` are set): set `node.prio`,
        and `node.tail_prio` to price its last block apart (None: priced with the node)."""

    def on_access(self, node: Node, tick: int, hit: bool) -> None:
        """`node` lay on the path of a match (hit=True) or of an insert (hit=False)."""

    def record_eviction(self, node: Node, hashes: tuple[int, ...]) -> None:
        """The blocks `hashes` of `node` (priority `node.evict_prio`) were just evicted
        (None when the policy does not use hashes and nobody asked for them)."""


class LRUPolicy:
    """Least recently used first."""

    name = "lru"
    uses_hashes = False

    def attach(self, num_blocks: int) -> None:
        pass

    def on_insert(self, node: Node, tick: int) -> None:
        node.prio = tick

    def on_access(self, node: Node, tick: int, hit: bool) -> None:
        node.prio = tick

    def record_eviction(self, node: Node, hashes: tuple[int, ...]) -> None:
        pass


class FrequencyAgeingPolicy:
    """GreedyDual frequency with ageing and a ghost history.

    prio = clock + 1 + log2(freq), where `clock` is the priority of the last victim (the ageing
    floor: a block that is not hit again sinks below newer ones) and `freq` counts the matches of
    the node, plus the frequency its blocks had when they were last evicted (the ghost history
    remembers `ghost_factor` x num_blocks evicted block hashes).

    Chosen from replays (benchmarks/bench_policy.py): on the Mooncake trace reuse is strongly
    frequency-dependent (P(reused again) is 0.24 after one use, 0.42 after two, 0.50 after three)
    but comes minutes later, so probation segments (S3-FIFO, SLRU) evict blocks before their next
    turn; frequency with ageing wins at small pools, LRU at large ones (it is near the ceiling
    there) and on workloads where past frequency does not predict (shuffled finite groups), so
    LRU stays the default.
    """

    name = "freq-ageing"
    uses_hashes = True

    def __init__(self, ghost_factor: float = 2.0) -> None:
        self.ghost_factor = ghost_factor
        self.ghost_capacity = 0
        self.ghost: OrderedDict[int, int] = OrderedDict()
        self.clock = 0.0

    def attach(self, num_blocks: int) -> None:
        self.ghost_capacity = int(self.ghost_factor * num_blocks)

    def on_insert(self, node: Node, tick: int) -> None:
        ghost = self.ghost
        remembered = 0
        if ghost:
            for h in node.hashes:
                f = ghost.pop(h, 0)
                if f > remembered:
                    remembered = f
        node.freq = remembered + 1
        node.prio = self.clock + 1.0 + math.log2(node.freq)

    def on_access(self, node: Node, tick: int, hit: bool) -> None:
        if hit:
            node.freq += 1
            node.prio = self.clock + 1.0 + math.log2(node.freq)

    def record_eviction(self, node: Node, hashes: tuple[int, ...]) -> None:
        if node.evict_prio > self.clock:
            self.clock = node.evict_prio
        if not self.ghost_capacity:
            return
        ghost = self.ghost
        for h in hashes:
            ghost[h] = node.freq
        while len(ghost) > self.ghost_capacity:
            ghost.popitem(last=False)


POLICIES: dict[str, type] = {
    "lru": LRUPolicy,
    "freq-ageing": FrequencyAgeingPolicy,
    "learned": LearnedReusePolicy,
}


def make_policy(name: str) -> EvictionPolicy:
    """A policy by its name (for configs and CLIs)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown eviction policy {name!r}; choose from {sorted(POLICIES)}"
        ) from None
