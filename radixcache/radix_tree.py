"""Radix tree at block granularity: match, insert, split, lock/pin refcounts, leaf eviction."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

from sortedcontainers import SortedList

from radixcache.hashing import Namespace, block_hashes
from radixcache.mrc import MissRatioCurve
from radixcache.policy import EvictionPolicy
from radixcache.radix_node import Node

HashFn = Callable[[Namespace, Sequence[int], "int | None"], list[int]]


class Walk(NamedTuple):
    node: Node  # deepest node matched (the namespace root when nothing matched)
    blocks: list[int]  # matched block ids, root first
    num_tokens: int
    path: list[Node]  # matched nodes below the root


class Victim(NamedTuple):
    node: Node
    blocks: tuple[int, ...]
    hashes: tuple[int, ...]
    tokens: tuple[int, ...]  # tokens of `blocks`, block_size per block


class RadixTree:
    """Children are keyed by their first block's tokens; each namespace has its own root."""

    def __init__(
        self,
        block_size: int,
        policy: EvictionPolicy,
        hash_fn: HashFn = block_hashes,
        mrc: MissRatioCurve | None = None,
    ) -> None:
        self.block_size = block_size
        self.policy = policy
        self.mrc = mrc
        self.hash_fn = hash_fn
        self.roots: dict[Namespace, Node] = {}
        self.hash_index: dict[int, int] = {}  # chained block hash -> block id
        self.block_node: dict[int, Node] = {}  # cached block id -> node holding it
        self.evictable = SortedList()  # (evict_prio, node id) of unreferenced, unpinned leaves
        self.evictable_nodes: dict[int, Node] = {}
        self.num_locked = 0  # cached blocks on a locked path
        self.num_pinned = 0  # cached blocks on a pinned path
        self.num_held = 0  # cached blocks on a locked or pinned path
        self.collisions = 0
        self.tick = 0
        self._next_id = 0

    # --- lookup ---
    def root(self, ns: Namespace) -> Node:
        root = self.roots.get(ns)
        if root is None:
            root = self.roots[ns] = self._new_node(ns, None, (), (), (), (), 0)
        return root

    def walk(
        self, ns: Namespace, tokens: tuple[int, ...], num_blocks: int, split: bool = True
    ) -> Walk:
        """Longest cached prefix of tokens[: num_blocks * bs]; splits the last node at its end.

        With split=False the tree is left as is: `node` is then the deepest fully matched node.
        """
        bs = self.block_size
        end = num_blocks * bs
        node = self.root(ns)
        pos, blocks, path = 0, [], []
        while pos < end:
            child = node.children.get(tokens[pos : pos + bs])
            if child is None:
                break
            size = len(child.tokens)
            if pos + size <= end and child.tokens == tokens[pos : pos + size]:
                matched = size
            else:
                matched = self._common_tokens(child.tokens, tokens, pos, end)
                if matched < size and not split:
                    blocks += child.blocks[: matched // bs]
                    return Walk(node, blocks, pos + matched, path)
                if matched < size:
                    child = self.split(child, matched // bs)
            blocks += child.blocks
            path.append(child)
            pos += matched
            node = child
            if matched < size:
                break
        return Walk(node, blocks, pos, path)

    def _common_tokens(
        self, stored: tuple[int, ...], tokens: tuple[int, ...], pos: int, end: int
    ) -> int:
        """Tokens (whole blocks) shared by `stored` and tokens[pos:end]; the first block is known
        to match. Gallops then bisects, so a long run costs O(log n) slice compares."""
        bs = self.block_size
        limit = min(len(stored), end - pos) // bs

        def same(n: int) -> bool:
            return stored[: n * bs] == tokens[pos : pos + n * bs]

        lo, step = 1, 1  # same(lo) holds
        while lo + step <= limit and same(lo + step):
            lo, step = lo + step, step * 2
        hi = min(lo + step, limit + 1)  # same(hi) fails or hi is out of range
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if same(mid) else (lo, mid)
        return lo * bs

    def touch(self, path: list[Node], matched_tokens: int = 0) -> None:
        """Record an access of every node on `path` (policy priorities, hit counters)."""
        self.tick += 1
        tick, now, policy, hit = self.tick, time.time(), self.policy, matched_tokens > 0
        if hit and self.mrc is not None:  # an insert's path was read by its match already
            self._sample_path(path, matched_tokens)
        for node in path:
            node.last_access = tick
            node.last_used = now
            if matched_tokens:
                node.hits += 1
                node.tokens_saved += len(node.tokens)
            listed = node.set_key is not None
            if listed:
                self._unlist(node)
            policy.on_access(node, tick, hit)
            if hit:
                node.tail_prio = None  # its tail was just read
            if listed:
                self._list(node)

    # --- insert ---
    def add_child(self, parent: Node, tokens: tuple[int, ...], blocks: tuple[int, ...]) -> Node:
        """Hang a new node of `blocks` (holding `tokens`) under `parent`."""
        bs = self.block_size
        parent_hash = parent.hashes[-1] if parent.hashes else None
        hashes = tuple(self.hash_fn(parent.ns, tokens, parent_hash))  # type: ignore[arg-type]
        key = tokens[:bs]
        node = self._new_node(parent.ns, parent, key, blocks, tokens, hashes, parent.end_depth)
        parent.children[key] = node
        self.block_node.update(dict.fromkeys(blocks, node))
        index = self.hash_index
        if index.keys().isdisjoint(hashes):
            index.update(zip(hashes, blocks, strict=True))
        else:
            for b, h in zip(blocks, hashes, strict=True):
                self.collisions += index.setdefault(h, b) != b
        self.policy.on_insert(node, self.tick)
        if self.mrc is not None:
            self.mrc.total += len(blocks)
            node.sampled = self.mrc.sample(hashes)
            if node.sampled:
                self.mrc.reference(node.sampled)
        self._refresh(node)
        if parent.set_key is not None:
            self._unlist(parent)
        return node

    def split(self, node: Node, k: int) -> Node:
        """Cut `node` after k blocks; the new upper part is returned, `node` keeps the rest."""
        bs = self.block_size
        parent = node.parent
        assert parent is not None and 0 < k < len(node.blocks)
        upper = self._new_node(
            node.ns,
            parent,
            node.key,
            node.blocks[:k],
            node.tokens[: k * bs],
            node.hashes[:k],
            node.depth,
        )
        for attr in ("lock_ref", "pin_ref", "last_access", "last_used", "hits", "prio", "freq"):
            setattr(upper, attr, getattr(node, attr))
        upper.tokens_saved = node.tokens_saved * k // len(node.blocks)
        node.tokens_saved -= upper.tokens_saved
        parent.children[node.key] = upper
        node.blocks, node.tokens, node.hashes = (
            node.blocks[k:],
            node.tokens[k * bs :],
            node.hashes[k:],
        )
        node.key, node.parent, node.depth = node.tokens[:bs], upper, upper.end_depth
        upper.children[node.key] = node
        block_node = self.block_node
        for b in upper.blocks:
            block_node[b] = upper
        if node.sampled:
            upper.sampled = tuple(h for h in node.sampled if h in upper.hashes)
            node.sampled = node.sampled[len(upper.sampled) :]
        return upper

    def _sample_path(self, path: list[Node], matched_tokens: int) -> None:
        mrc = self.mrc
        assert mrc is not None
        mrc.total += matched_tokens // self.block_size
        parts = [node.sampled for node in path if node.sampled]
        if parts:
            mrc.reference([h for part in parts for h in part])

    # --- references ---
    def add_refs(self, node: Node, locks: int, pins: int) -> None:
        """Add lock/pin references to every node on the path root..node."""
        while node.parent is not None:
            if node.lock_ref + locks < 0 or node.pin_ref + pins < 0:  # the deepest node first
                raise ValueError(f"{node} unlocked or unpinned more often than held")
            was_l, was_p = node.lock_ref > 0, node.pin_ref > 0
            node.lock_ref += locks
            node.pin_ref += pins
            is_l, is_p = node.lock_ref > 0, node.pin_ref > 0
            n = len(node.blocks)
            self.num_locked += n * (is_l - was_l)
            self.num_pinned += n * (is_p - was_p)
            held = (is_l or is_p) - (was_l or was_p)
            if held:
                self.num_held += n * held
                self._refresh(node)
            node = node.parent

    # --- eviction ---
    def pop_victim(self, max_blocks: int) -> Victim | None:
        """Evict up to max_blocks tail blocks of the lowest-priority evictable leaf."""
        if not self.evictable:
            return None
        _, node_id = self.evictable.pop(0)
        node = self.evictable_nodes.pop(node_id)
        node.set_key = None
        if node.tail_prio is not None:  # listed by its tail's priority: only the tail goes
            max_blocks = 1
        return self._cut_tail(node, min(max_blocks, len(node.blocks)))

    def evict_node(self, node: Node) -> Victim:
        """Evict all blocks of an evictable leaf."""
        self._unlist(node)
        return self._cut_tail(node, len(node.blocks))

    def _cut_tail(self, node: Node, n: int) -> Victim:
        bs = self.block_size
        keep = len(node.blocks) - n
        victim = Victim(node, node.blocks[keep:], node.hashes[keep:], node.tokens[keep * bs :])
        node.blocks, node.hashes = node.blocks[:keep], node.hashes[:keep]
        node.tokens = node.tokens[: keep * bs]
        if node.sampled:
            gone = set(victim.hashes)
            node.sampled = tuple(h for h in node.sampled if h not in gone)
        index, block_node = self.hash_index, self.block_node
        for b, h in zip(victim.blocks, victim.hashes, strict=True):
            del block_node[b]
            if index.get(h) == b:
                del index[h]
        self.policy.on_evict(node, victim.hashes)
        node.tail_prio = None
        if keep:
            self._list(node)
        else:
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.parent = None
            self._refresh(parent)
        return victim

    # --- evictable set ---
    def _refresh(self, node: Node) -> None:
        should = (
            node.parent is not None
            and not node.children
            and node.lock_ref == 0
            and node.pin_ref == 0
        )
        if should and node.set_key is None:
            self._list(node)
        elif not should and node.set_key is not None:
            self._unlist(node)

    def _list(self, node: Node) -> None:
        node.set_key = (node.evict_prio, node.id)
        self.evictable.add(node.set_key)
        self.evictable_nodes[node.id] = node

    def _unlist(self, node: Node) -> None:
        self.evictable.remove(node.set_key)
        del self.evictable_nodes[node.id]
        node.set_key = None

    def _new_node(self, ns, parent, key, blocks, tokens, hashes, depth) -> Node:  # noqa: ANN001
        self._next_id += 1
        return Node(self._next_id, ns, parent, key, blocks, tokens, hashes, depth)

    def iter_nodes(self) -> list[Node]:
        out: list[Node] = []
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
