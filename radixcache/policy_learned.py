"""GreedyDual with a reuse probability learned online per class of block."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixcache.radix_node import Node

Class = tuple[object, ...]


def log_bucket(n: int) -> int:
    return min(n.bit_length(), 7)


def tail_class(cls: Class) -> Class:
    """The class of a node's last block while it has not been read."""
    return ("tail", *cls)


class LearnedReusePolicy:
    """prio = clock + max(P(class) - floor, eps): the likelier a block is to be read again, the
    longer it outlives the ageing floor `clock` (the priority of the last victim).

    A node's class says how it was last referenced:
    - ("new", log2 bucket of the match depth, log2 bucket of the blocks inserted): fresh blocks.
      On the Mooncake trace a first turn's blocks are read again 22-43% of the time (less the
      longer the turn), a later turn that adds >= 8 blocks only ~10%, one that adds 1-4 blocks
      42-63%;
    - ("hit", uses so far, capped at 4): re-read blocks (P 0.42 after one use, 0.79 after four);
    - ("tail", *class): the last block of an insert until it is first read, priced through
      `node.tail_prio` (on Mooncake a request's last block is read again 0.8% of the time: the
      next turn rewrites it).
    P(class) is learned online, block-weighted: refs[c] counts blocks referenced as class c,
    hits[c] those of them read again while cached or while remembered in the ghost history
    (`ghost_factor` x num_blocks evicted hashes, with their class and use count). So the policy
    adapts to the workload instead of assuming frequency predicts reuse (on shuffled finite
    groups the learned P falls with use count and the order turns LRU-like). Counters halve
    every `decay_factor` x num_blocks referenced blocks. O(1) per access plus the tree's
    O(log n) ordered-set update.
    """

    name = "learned"
    uses_hashes = True

    def __init__(
        self,
        ghost_factor: float = 2.0,
        floor: float = 0.1,
        eps: float = 0.01,
        decay_factor: float = 16.0,
    ) -> None:
        self.ghost_factor = ghost_factor
        self.floor = floor
        self.eps = eps
        self.decay_factor = decay_factor
        self.ghost_capacity = 0
        self.decay_every = 0.0
        self.ghost: OrderedDict[int, tuple[int, Class]] = OrderedDict()
        self.node_class: dict[int, Class] = {}  # first block hash of a node -> its class
        self.refs: dict[Class, float] = {}
        self.hits: dict[Class, float] = {}
        self.since_decay = 0.0
        self.clock = 0.0

    def attach(self, num_blocks: int) -> None:
        self.ghost_capacity = int(self.ghost_factor * num_blocks)
        self.decay_every = self.decay_factor * max(num_blocks, 1)

    def reuse_probability(self, cls: Class) -> float:
        return (self.hits.get(cls, 0.0) + 1.0) / (self.refs.get(cls, 0.0) + 4.0)

    def on_insert(self, node: Node, tick: int) -> None:
        remembered = 0
        if self.ghost:
            for h in node.hashes:
                entry = self.ghost.pop(h, None)
                if entry is not None:
                    self._credit(entry[1], 1)
                    remembered = max(remembered, entry[0])
        node.freq = remembered + 1
        if remembered:
            cls: Class = ("hit", min(remembered, 4))
        else:
            n = len(node.blocks)
            block_size = len(node.tokens) // n if n else 1
            cls = ("new", log_bucket(node.depth // block_size), log_bucket(n))
        self._reference(node, cls, tail=True)

    def on_access(self, node: Node, tick: int, hit: bool) -> None:
        if not hit or not node.hashes:
            return
        old = self.node_class.get(node.hashes[0])
        tail = node.tail_prio is not None
        if old is not None:
            self._credit(old, len(node.blocks) - tail)
            if tail:
                self._credit(tail_class(old), 1)
        node.freq += 1
        self._reference(node, ("hit", min(node.freq - 1, 4)))

    def record_eviction(self, node: Node, hashes: tuple[int, ...]) -> None:
        if node.evict_prio > self.clock:  # the victim's priority: its tail's while pending
            self.clock = node.evict_prio
        key = node.hashes[0] if node.hashes else hashes[0]
        cls = self.node_class.get(key, ("hit", min(node.freq, 4)))
        if not node.blocks:
            self.node_class.pop(key, None)
        if not self.ghost_capacity:
            return
        ghost = self.ghost
        for h in hashes:
            ghost[h] = (node.freq, cls)
        if node.tail_prio is not None:
            ghost[hashes[-1]] = (node.freq, tail_class(cls))
        while len(ghost) > self.ghost_capacity:
            ghost.popitem(last=False)

    def _reference(self, node: Node, cls: Class, tail: bool = False) -> None:
        n = len(node.blocks)
        self.node_class[node.hashes[0]] = cls
        self.refs[cls] = self.refs.get(cls, 0.0) + n - tail
        self.since_decay += n
        if self.since_decay > self.decay_every:
            self._decay()
        node.prio = self._priority(cls)
        if tail:
            t = tail_class(cls)
            self.refs[t] = self.refs.get(t, 0.0) + 1
            node.tail_prio = self._priority(t)

    def _priority(self, cls: Class) -> float:
        return self.clock + max(self.reuse_probability(cls) - self.floor, self.eps)

    def _credit(self, cls: Class, n: int) -> None:
        self.hits[cls] = self.hits.get(cls, 0.0) + n

    def _decay(self) -> None:
        self.since_decay = 0.0
        for counts in (self.refs, self.hits):
            for cls in counts:
                counts[cls] /= 2
