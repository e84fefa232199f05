"""ReplicaIndex: what one replica has cached, as a radixcache PrefixCache over token ids.

Fed either by the replica's KV events (exact: BlockStored adds the blocks' tokens under their
parent, BlockRemoved marks them gone) or, for a replica without events, by the prompts the router
sent it (approximate, as SGLang's router does). The index is bounded: when full, the PrefixCache
evicts its least recently used leaves. It keeps no KV, only which token blocks the replica holds.

A removed block cannot be cut out of the PrefixCache through its public methods, so it is marked
dead (by the index's block id) and a match stops at the first dead block; the id is reused (and
the mark cleared) when the index evicts it or the replica stores the same block again.

With events (`exact`), what the router has just sent counts as pending for `pending_s` seconds:
the replica is computing it, and a request for the same prefix arriving meanwhile should follow
(the replica's events confirm the blocks, or the pending mark expires).
"""

from __future__ import annotations

import time
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache

_NS_MODEL = "router-replica-index"
ReplicaHash = int | bytes


@dataclass
class IndexCounts:
    stored_blocks: int = 0
    removed_blocks: int = 0
    cleared: int = 0
    orphans: int = 0  # BlockStored whose parent the index never saw (events were lost)


class ReplicaIndex:
    def __init__(
        self,
        capacity_blocks: int,
        block_size: int = 16,
        exact: bool = False,
        pending_s: float = 30.0,
    ) -> None:
        self.capacity_blocks = capacity_blocks
        self.exact = exact
        self.pending_s = pending_s
        self.counts = IndexCounts()
        self._reset(block_size)

    def _reset(self, block_size: int) -> None:
        self.block_size = block_size
        self.ns = Namespace(model_id=_NS_MODEL, kv_dtype="-", block_size=block_size)
        self.cache = PrefixCache(self.capacity_blocks, block_size, mrc_sample_rate=None)
        self._parent: dict[ReplicaHash, ReplicaHash | None] = {}
        self._tokens: dict[ReplicaHash, tuple[int, ...]] = {}
        self._id_of: dict[ReplicaHash, int] = {}  # replica's block hash -> index block id
        self._hash_of: dict[int, ReplicaHash] = {}
        self._dead: set[int] = set()
        self._pending: dict[int, float] = {}  # index block id -> monotonic expiry (exact only)

    # --- fed by events ---
    def stored(
        self,
        hashes: list[ReplicaHash],
        parent: ReplicaHash | None,
        tokens: list[int],
        block_size: int,
    ) -> None:
        if block_size and block_size != self.block_size and not self._id_of:
            self._reset(block_size)
        bs = self.block_size
        if len(tokens) != len(hashes) * bs or not hashes:
            return
        if parent is not None and parent not in self._tokens:
            self.counts.orphans += 1
            return
        for i, h in enumerate(hashes):
            self._parent[h] = parent if i == 0 else hashes[i - 1]
            self._tokens[h] = tuple(tokens[i * bs : (i + 1) * bs])
        path = self._path(hashes[-1])
        if path is None:
            self.counts.orphans += 1
            return
        ids = self._insert(path)
        for h, b in zip(hashes, ids[len(ids) - len(hashes) :], strict=True):
            self._bind(h, b)
        self.counts.stored_blocks += len(hashes)

    def removed(self, hashes: list[ReplicaHash]) -> None:
        for h in hashes:
            b = self._id_of.pop(h, None)
            self._tokens.pop(h, None)
            self._parent.pop(h, None)
            if b is not None:
                self._hash_of.pop(b, None)
                self._pending.pop(b, None)
                self._dead.add(b)
                self.counts.removed_blocks += 1

    def cleared(self) -> None:
        self.counts.cleared += 1
        self._reset(self.block_size)

    # --- fed by the router itself ---
    def sent(self, tokens: Sequence[int]) -> None:
        """The router sent this prompt: without events, assume the replica keeps it; with events,
        count its blocks the replica has not confirmed as pending for a while."""
        n = len(tokens) // self.block_size * self.block_size
        if not n:
            return
        if not isinstance(tokens, array):  # packed once, not by each call into the tree
            tokens = array("q", tokens)
        expiry = time.monotonic() + self.pending_s
        for b in self._insert(tokens[:n]):
            if self.exact and b not in self._hash_of:
                self._pending[b] = expiry
            self._dead.discard(b)

    # --- queries ---
    def match(self, tokens: Sequence[int]) -> int:
        """Tokens of the longest prefix of `tokens` the replica holds (a whole number of blocks)."""
        found = self.cache.peek(self.ns, tokens)
        now, n = time.monotonic(), 0
        for b in found.block_ids:
            if b in self._dead:
                break
            if self.exact and b not in self._hash_of and self._pending.get(b, 0.0) < now:
                break
            n += 1
        return n * self.block_size

    def num_blocks(self) -> int:
        return self.cache.num_cached_blocks() - len(self._dead)

    # --- helpers ---
    def _path(self, last: ReplicaHash) -> tuple[int, ...] | None:
        """Tokens from the root to block `last`; None when an ancestor was removed meanwhile."""
        chain: list[tuple[int, ...]] = []
        h: ReplicaHash | None = last
        while h is not None:
            block = self._tokens.get(h)
            if block is None:
                return None
            chain.append(block)
            h = self._parent.get(h)
        return tuple(t for block in reversed(chain) for t in block)

    def _insert(self, tokens: array) -> list[int]:
        """Inserts the full blocks of `tokens`; returns the index block ids of the whole path."""
        cache, n = self.cache, len(tokens) // self.block_size
        found = cache.match(self.ns, tokens)
        cache.lock(found.handle)  # keep the matched path from being evicted by the allocate
        try:
            new = cache.allocate(n - len(found.block_ids)) or []
            for b in new:  # ids reused after an eviction: forget what they held
                self._dead.discard(b)
                self._pending.pop(b, None)
                h = self._hash_of.pop(b, None)
                if h is not None:
                    self._id_of.pop(h, None)
            if len(found.block_ids) + len(new) < n:
                cache.free(new)
                return list(found.block_ids)
            result = cache.insert(self.ns, tokens, list(found.block_ids) + new)
            return list(result.block_ids)
        finally:
            cache.unlock(found.handle)

    def _bind(self, h: ReplicaHash, b: int) -> None:
        old = self._hash_of.get(b)
        if old is not None and old != h:
            self._id_of.pop(old, None)
        self._id_of[h] = b
        self._hash_of[b] = h
        self._dead.discard(b)
        self._pending.pop(b, None)
