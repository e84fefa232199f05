"""The facade the engine uses: block ownership, prefix matching, insertion, eviction, stats."""

from __future__ import annotations

import struct
from array import array
from collections.abc import Callable, Sequence
from functools import partial
from itertools import repeat

import numpy as np

from radixcache.block_pool import BlockPool, BlockPoolError
from radixcache.hashing import Namespace, block_hashes
from radixcache.integrity import CacheParts, check_integrity
from radixcache.lookahead import continuation
from radixcache.mrc import DEFAULT_RATIOS, MissRatioCurve
from radixcache.pinning import PinRegistry
from radixcache.policy import EvictionPolicy, make_policy
from radixcache.radix_node import Node
from radixcache.radix_tree import HashFn, RadixTree, Tokens, Victim
from radixcache.results import (
    EvictedBlock,
    InsertResult,
    MatchResult,
    NodeHandle,
    StaleHandleError,
)
from radixcache.stats import CacheStats, MissRatioPoint, NamespaceStats, PrefixInfo, prefix_info
from radixcache.window_blocks import WindowBlocks, WindowStats


def _as_tokens(tokens: Sequence[int] | np.ndarray) -> Tokens:
    """Token ids as the tree holds them: array("q") (the engine's own type, used as it is), so
    token runs compare as memory (memcmp). Anything else is copied into one, once per call."""
    if type(tokens) is array and tokens.typecode == "q":
        return tokens
    if isinstance(tokens, np.ndarray):
        out = array("q")
        out.frombytes(tokens.astype(np.int64, copy=False).tobytes())
        return out
    return array("q", struct.pack(f"{len(tokens)}q", *tokens))  # faster than array("q", list)


class PrefixCache:
    """Owns block ids 0..num_blocks-1: free, private to one sequence, or cached in the radix tree."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        max_pinned_fraction: float = 0.5,
        policy: EvictionPolicy | str | None = None,
        hash_fn: HashFn = block_hashes,
        mrc_sample_rate: float | None = -1.0,
        windows: WindowBlocks | None = None,
    ) -> None:
        """`policy`: an EvictionPolicy or its name ("lru", the default, or "freq-ageing").
        `mrc_sample_rate`: share of blocks the miss-ratio curve samples; None turns it off,
        the default samples one block per 4,096 tokens. `windows`: the sliding-window layers'
        twins of the cached blocks (a hybrid model); they go when their blocks are evicted."""
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.max_pinned_blocks = int(max_pinned_fraction * num_blocks)
        self.pool = BlockPool(num_blocks)
        if policy is None or isinstance(policy, str):
            policy = make_policy(policy or "lru")
        policy.attach(num_blocks)
        if mrc_sample_rate is not None and mrc_sample_rate < 0:
            mrc_sample_rate = min(1.0, block_size / 4096)
        mrc = None
        if mrc_sample_rate is not None:
            mrc = MissRatioCurve(mrc_sample_rate, max_blocks=int(max(DEFAULT_RATIOS) * num_blocks))
        self.tree = RadixTree(block_size, policy, self.pool, hash_fn, mrc)
        self.pins = PinRegistry(self.tree, self.max_pinned_blocks)
        self._ns_stats: dict[Namespace, NamespaceStats] = {}
        self.windows = windows

    # --- block ownership ---
    def num_free_blocks(self) -> int:
        return self.pool.num_free()

    def num_evictable_blocks(self) -> int:
        return self.tree.num_cached - self.tree.num_held

    def num_cached_blocks(self) -> int:
        return self.tree.num_cached

    def can_allocate(self, n: int) -> bool:
        return self.pool.num_free() + self.num_evictable_blocks() >= n

    def allocate(
        self, n: int, on_evict: Callable[[list[EvictedBlock]], None] | None = None
    ) -> list[int] | None:
        """`n` free block ids, or None when not even eviction frees enough. When the free list
        is short, the policy's victims are evicted first: handed to `on_evict` (with hashes and
        tokens, for a caller that keeps evicted KV: spill tiers, events) or dropped (see `drop`).
        This is the one place that decides when and how much to evict."""
        if n < 0:
            raise ValueError("n must be >= 0")
        short = n - self.pool.num_free()
        if short > 0:
            if short > self.num_evictable_blocks():
                return None
            if on_evict is None:
                self.drop(short)
            else:
                on_evict(self.evict(short))
        return self.pool.take(n)

    def free(self, block_ids: Sequence[int]) -> None:
        """Drops the caller's private blocks (never the tree's)."""
        for b in block_ids:
            self.pool.decref(b)

    # --- prefix index ---
    def match(self, ns: Namespace, tokens: Sequence[int] | np.ndarray) -> MatchResult:
        self._check_ns(ns)
        toks = _as_tokens(tokens)
        tree = self.tree
        walk = tree.walk(ns, toks, len(toks) // self.block_size)
        tree.touch(walk.path, walk.num_tokens)
        st = self._stats_of(ns)
        st.lookups += 1
        st.lookup_tokens += len(toks)
        st.hit_tokens += walk.num_tokens
        last = partial(tree.hash_of_block, walk.node, walk.blocks[-1]) if walk.blocks else None
        return MatchResult(walk.blocks, walk.num_tokens, walk.node, last)

    def peek(self, ns: Namespace, tokens: Sequence[int] | np.ndarray) -> MatchResult:
        """Like match, but changes nothing (no stats, no recency, no split): for lookups only.

        The handle is the deepest fully matched node; do not lock it."""
        self._check_ns(ns)
        toks = _as_tokens(tokens)
        tree = self.tree
        walk = tree.walk(ns, toks, len(toks) // self.block_size, split=False)
        holder = walk.partial or walk.node
        last = partial(tree.hash_of_block, holder, walk.blocks[-1]) if walk.blocks else None
        return MatchResult(walk.blocks, walk.num_tokens, walk.node, last)

    def lookahead(
        self, ns: Namespace, handle: NodeHandle | None, tail: Sequence[int], limit: int
    ) -> list[int]:
        """Up to `limit` cached tokens continuing a sequence whose locked prefix ends at `handle`
        (None: nothing locked, the namespace root) and whose tokens after it are `tail`; the
        tree is not touched (no recency, no stats). Drafts for speculative decoding."""
        node = self.tree.roots.get(ns) if handle is None else handle
        if node is None or node.ns != ns:
            return []
        return list(continuation(node, _as_tokens(tail), limit))

    def holds_next_block(
        self, ns: Namespace, handle: NodeHandle | None, block: Sequence[int]
    ) -> bool:
        """Whether the tree holds a block of these `block_size` tokens right after `handle`
        (None: the namespace root): committing such a block switches to the tree's copy."""
        node = self.tree.roots.get(ns) if handle is None else handle
        if node is None or node.ns != ns or len(block) != self.block_size:
            return False
        return self.tree.key_of(_as_tokens(block), 0) in node.children

    def is_cached(self, block_id: int) -> bool:
        """True when the tree owns `block_id` (it may also carry private references)."""
        return self.pool.owned(block_id)

    def lock(self, handle: NodeHandle) -> None:
        self._check_handle(handle)
        self.tree.add_refs(handle, 1, 0)

    def unlock(self, handle: NodeHandle) -> None:
        self._check_handle(handle)
        self.tree.add_refs(handle, -1, 0)

    def insert(
        self, ns: Namespace, tokens: Sequence[int] | np.ndarray, block_ids: Sequence[int]
    ) -> InsertResult:
        self._check_ns(ns)
        bs, toks, n = self.block_size, _as_tokens(tokens), len(block_ids)
        if len(toks) < n * bs:
            raise ValueError(f"{n} blocks need {n * bs} tokens, got {len(toks)}")
        tree = self.tree
        given = block_ids if type(block_ids) is list else list(block_ids)
        walk = tree.walk(ns, toks, n, ids=given)
        tree.touch(walk.path)
        done = walk.num_tokens // bs
        ids = walk.blocks
        duplicates = []
        if not walk.by_ids:  # some matched blocks may be the caller's own copies
            head = list(block_ids[:done])
            duplicates = [b for b, t in zip(head, ids, strict=True) if b != t]
        node = walk.node
        if done < n:
            new = list(block_ids[done:n])
            try:
                self.pool.adopt_many(new)
            except BlockPoolError as e:
                raise ValueError(str(e)) from None
            node = tree.add_child(node, toks, new)
            ids += new
            self._stats_of(ns).inserted_blocks += len(new)
        return InsertResult(ids, node, duplicates)

    def evict(self, n: int) -> list[EvictedBlock]:
        """Frees at least `n` blocks (fewer if not evictable) and returns what they held."""
        return self._release(self._pop_victims(n, with_hashes=True))

    def drop(self, n: int) -> int:
        """Like evict, for a caller that keeps nothing of the evicted blocks (no spill tier):
        no EvictedBlock per block and no hashes. Returns the blocks freed."""
        victims = self._pop_victims(n, with_hashes=False)
        self._free_victims(victims)
        return sum(len(v.blocks) for v in victims)

    def _pop_victims(self, n: int, with_hashes: bool) -> list[Victim]:
        victims: list[Victim] = []
        freed = 0
        while freed < n:
            victim = self.tree.pop_victim(n - freed, with_hashes)
            if victim is None:
                break
            victims.append(victim)
            freed += len(victim.blocks)
        return victims

    def hashes_of(self, handle: NodeHandle) -> list[int]:
        """The chained hashes of the blocks on the path to `handle`."""
        return self.tree.path_hashes(handle)

    def block_hashes_of(self, block_ids: Sequence[int]) -> list[int]:
        """The chained hashes of cached blocks."""
        return self.tree.block_hashes(block_ids)

    def lookup_hash(self, ns: Namespace, block_hash: int, tokens: Sequence[int]) -> int | None:
        """Cached block id of `block_hash` whose stored tokens equal `tokens` (collision guard)."""
        self.tree.hash_all()  # the pool's index then holds every cached block
        b = self.pool.cached_block(block_hash)
        if b is None:
            return None
        owner_ns, stored = self.tree.block_tokens(b)
        return b if owner_ns == ns and stored == _as_tokens(tokens) else None

    # --- pinning ---
    def pin(self, ns: Namespace, tokens: Sequence[int] | np.ndarray) -> int:
        """Pin the cached prefix of `tokens` (capped by max_pinned_fraction); tokens pinned."""
        self._check_ns(ns)
        return self.pins.pin(ns, _as_tokens(tokens))

    def unpin(self, ns: Namespace, tokens: Sequence[int] | np.ndarray) -> int:
        """Undo one earlier pin of the same tokens; tokens unpinned."""
        return self.pins.unpin(ns, _as_tokens(tokens))

    # --- maintenance and analytics ---
    def flush(self, ns: Namespace | None = None) -> list[EvictedBlock]:
        victims: list[Victim] = []
        while True:
            nodes = [n for n in self.tree.evictable_nodes.values() if ns is None or n.ns == ns]
            if not nodes:
                break
            victims += [self.tree.evict_node(n) for n in nodes]
        return self._release(victims)

    def forget(self, ns: Namespace) -> None:
        """Drops a namespace that holds nothing any more (its root and its counters)."""
        root = self.tree.roots.get(ns)
        if root is not None and not root.children and root.lock_ref == 0 and root.pin_ref == 0:
            del self.tree.roots[ns]
            self._ns_stats.pop(ns, None)

    def stats(self) -> CacheStats:
        tree = self.tree
        cached = tree.num_cached
        return CacheStats(
            num_blocks=self.num_blocks,
            block_size=self.block_size,
            free=self.pool.num_free(),
            evictable=cached - tree.num_held,
            referenced=self.pool.num_private() + tree.num_locked,
            pinned=tree.num_held - tree.num_locked,
            cached=cached,
            policy=tree.policy.name,
            hash_collisions=self.pool.hash_collisions,
            namespaces={ns: NamespaceStats(**vars(s)) for ns, s in self._ns_stats.items()},
            miss_ratio_curve=self.miss_ratio_curve(),
            windows=self._window_stats(),
        )

    def _window_stats(self) -> WindowStats | None:
        if self.windows is None:
            return None
        stats = self.windows.stats()
        stats.tombstones = self.tree.num_cached - stats.cached
        return stats

    def miss_ratio_curve(self, ratios: Sequence[float] = DEFAULT_RATIOS) -> list[MissRatioPoint]:
        """Estimated LRU block hit rate at other pool sizes (empty when sampling is off)."""
        mrc = self.tree.mrc
        if mrc is None:
            return []
        return [MissRatioPoint(*point) for point in mrc.curve(self.num_blocks, ratios)]

    def hottest_prefixes(
        self,
        limit: int,
        ns_filter: Namespace | Callable[[Namespace], bool] | None = None,
        preview: int = 64,
    ) -> list[PrefixInfo]:
        def keep(node: Node) -> bool:
            if node.parent is None or node.ns is None:
                return False
            if ns_filter is None:
                return True
            return ns_filter(node.ns) if callable(ns_filter) else node.ns == ns_filter

        nodes = [n for n in self.tree.iter_nodes() if keep(n)]
        nodes.sort(key=lambda n: (n.hits, n.end_depth), reverse=True)
        return [prefix_info(n, preview) for n in nodes[:limit]]

    def check_integrity(self, window_refs: dict[int, int] | None = None) -> None:
        """`window_refs`: each window block's references counted from the sequences' tables
        (checked against the window pool's counts when given)."""
        parts = CacheParts(
            self.pool,
            self.tree,
            self.num_blocks,
            self.block_size,
            self.max_pinned_blocks,
        )
        check_integrity(parts)
        if self.windows is not None:
            cached = {b for n in self.tree.iter_nodes() for b in n.blocks}
            self.windows.check_integrity(cached, window_refs)

    # --- helpers ---
    def _release(self, victims: list[Victim]) -> list[EvictedBlock]:
        """Returns the victims' blocks to the free list; their KV stays until the ids are reused."""
        bs, new = self.block_size, tuple.__new__
        evicted: list[EvictedBlock] = []
        for v in victims:
            n, ns = len(v.blocks), v.node.ns
            per_block = np.frombuffer(v.tokens, dtype=np.int64).reshape(n, bs).tolist()  # in C
            twins = repeat(0, n) if self.windows is None else map(self.windows.twin_of, v.blocks)
            fields = zip(v.blocks, repeat(ns, n), v.hashes, per_block, twins, strict=True)  # type: ignore[arg-type]
            evicted += map(new, repeat(EvictedBlock, n), fields)  # EvictedBlock(*f), in C
        self._free_victims(victims)
        return evicted

    def _free_victims(self, victims: list[Victim]) -> None:
        """Counts the victims' blocks as evicted and frees them, in one pool update."""
        if not victims:
            return
        blocks: list[int] = []
        for v in victims:
            self._stats_of(v.node.ns).evicted_blocks += len(v.blocks)  # type: ignore[arg-type]
            blocks += v.blocks
        if self.windows is not None:
            self.windows.drop(blocks)
        self.pool.release_owned(blocks)

    def _stats_of(self, ns: Namespace) -> NamespaceStats:
        st = self._ns_stats.get(ns)
        if st is None:
            st = self._ns_stats[ns] = NamespaceStats()
        return st

    def _check_ns(self, ns: Namespace) -> None:
        if ns.block_size != self.block_size:
            raise ValueError(f"namespace block_size {ns.block_size} != {self.block_size}")

    def _check_handle(self, handle: NodeHandle) -> None:
        if handle.parent is None and self.tree.roots.get(handle.ns) is not handle:  # type: ignore[arg-type]
            raise StaleHandleError(f"{handle} was evicted")
