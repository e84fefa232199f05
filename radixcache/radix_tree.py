"""Radix tree at block granularity: match, insert, split, lock/pin refcounts, leaf eviction.

A node holds its run of blocks as a list of block ids and an array("q") of tokens, so matching,
splitting and cutting cost C-level slices and memory compares, not a Python step per block.
Token ids reach the tree as array("q") (PrefixCache converts anything else once, at its door). Chained block hashes are
computed lazily, once per block (`hash_path`): only blocks that are spilled, published, looked
up by hash, or read by a policy that keys on hashes need one. The block pool's hash index
(hash -> block id) and the tree's `owner` (block id -> node) hold exactly the hashed blocks; a
hashed node's ancestors are hashed too, so every hash chains from the namespace root.
"""

from __future__ import annotations

import heapq
import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

from radixcache.block_pool import BlockPool
from radixcache.hashing import Namespace, block_hashes
from radixcache.mrc import MissRatioCurve, unit_blocks, unit_keys
from radixcache.policy import EvictionPolicy
from radixcache.radix_node import Node

HashFn = Callable[[Namespace, Sequence[int], "int | None"], list[int]]
Tokens = array  # array("q"): token runs are compared as memory


class Walk(NamedTuple):
    node: Node  # deepest fully matched node (the namespace root when nothing matched)
    blocks: list[int]  # matched block ids, root first
    num_tokens: int
    path: list[Node]  # fully matched nodes below the root
    partial: Node | None  # split=False only: the child whose first blocks matched too
    by_ids: bool = False  # every matched block was found by the caller's ids (no duplicates)


class Victim(NamedTuple):
    node: Node
    blocks: list[int]
    hashes: tuple[int, ...] | None  # None: never hashed, and the caller did not ask
    tokens: array  # tokens of `blocks`, block_size per block


class BlockNodes:
    """block id -> the node holding it (debugging and tests: hashes every block first)."""

    def __init__(self, tree: RadixTree) -> None:
        self.tree = tree

    def __getitem__(self, block_id: int) -> Node:
        self.tree.hash_all()
        return self.tree.owner[block_id]

    def get(self, block_id: int, default: Node | None = None) -> Node | None:
        self.tree.hash_all()
        return self.tree.owner.get(block_id, default)

    def __contains__(self, block_id: object) -> bool:
        self.tree.hash_all()
        return block_id in self.tree.owner

    def __len__(self) -> int:
        return self.tree.num_cached


class RadixTree:
    """Children are keyed by their first block's tokens; each namespace has its own root."""

    def __init__(
        self,
        block_size: int,
        policy: EvictionPolicy,
        pool: BlockPool,
        hash_fn: HashFn = block_hashes,
        mrc: MissRatioCurve | None = None,
    ) -> None:
        """`pool`: the block pool whose hash index the tree keeps (it hashes the blocks)."""
        self.block_size = block_size
        self.policy = policy
        self.pool = pool
        self.mrc = mrc
        self.hash_fn = hash_fn
        self.hash_on_insert = getattr(policy, "uses_hashes", True)
        self.unit = unit_blocks(mrc.rate, block_size) if mrc is not None else 1
        self.unit_threshold = mrc.unit_threshold(self.unit) if mrc is not None else 0
        self.roots: dict[Namespace, Node] = {}
        self.owner: dict[int, Node] = {}  # hashed block id -> node holding it
        self.unhashed: dict[int, Node] = {}  # node id -> node not hashed yet
        # (evict_prio, node id) of unreferenced, unpinned leaves: a heap whose entries stay
        # behind when a node is unlisted (stale: node.set_key differs) and are skipped on pop
        self.evictable: list[tuple[float, int]] = []
        self.evictable_nodes: dict[int, Node] = {}
        self.num_cached = 0  # cached blocks
        self.num_locked = 0  # cached blocks on a locked path
        self.num_pinned = 0  # cached blocks on a pinned path
        self.num_held = 0  # cached blocks on a locked or pinned path
        self.tick = 0
        self._next_id = 0

    @property
    def block_node(self) -> BlockNodes:
        return BlockNodes(self)

    # --- lookup ---
    def root(self, ns: Namespace) -> Node:
        root = self.roots.get(ns)
        if root is None:
            root = self.roots[ns] = self._new_node(ns, None, b"", [], array("q"), (), 0)
        return root

    def walk(
        self,
        ns: Namespace,
        tokens: Tokens,
        num_blocks: int,
        split: bool = True,
        ids: list[int] | None = None,
    ) -> Walk:
        """Longest cached prefix of tokens[: num_blocks * bs]; splits the last node at its end.

        With split=False the tree is left as is: `node` is then the deepest fully matched node
        and `partial` the child matched part-way. With `ids` (an insert's block ids), a child
        whose blocks are exactly ids at its position is taken without comparing its tokens:
        the caller got those ids from a match of the same tokens (their KV is the tree's)."""
        bs = self.block_size
        end = num_blocks * bs
        node = self.root(ns)
        pos, blocks, path, by_ids = 0, [], [], ids is not None
        while pos < end:
            key = tokens[pos] if bs == 1 else tokens[pos : pos + bs].tobytes()
            child = node.children.get(key)
            if child is None:
                break
            stored = child.tokens
            size = len(stored)
            if (
                pos + size <= end
                and ids is not None
                and child.blocks == ids[pos // bs : (pos + size) // bs]
            ):
                matched = size
            elif pos + size <= end and stored == tokens[pos : pos + size]:
                matched, by_ids = size, False
            else:
                by_ids = False
                matched = self._common_tokens(stored, tokens, pos, end)
                if not split:
                    blocks += child.blocks[: matched // bs]
                    return Walk(node, blocks, pos + matched, path, child)
                child = self.split(child, matched // bs)
            blocks += child.blocks
            path.append(child)
            pos += matched
            node = child
            if matched < size:
                break
        return Walk(node, blocks, pos, path, None, by_ids)

    def _common_tokens(self, stored: Tokens, tokens: Tokens, pos: int, end: int) -> int:
        """Tokens (whole blocks) shared by `stored` and tokens[pos:end]; the first block is known
        to match. Gallops over doubling windows, then bisects the window that differs: each
        token is compared about twice, in C-level slice compares."""
        bs = self.block_size
        limit = min(len(stored), end - pos) // bs  # blocks that could match

        def same(a: int, b: int) -> bool:  # blocks [a, b) equal
            return stored[a * bs : b * bs] == tokens[pos + a * bs : pos + b * bs]

        lo, step = 1, 1  # blocks [0, lo) match
        while lo < limit:
            hi = min(lo + step, limit)
            if not same(lo, hi):
                while hi - lo > 1:  # [0, lo) match, [lo, hi) differs somewhere
                    mid = (lo + hi) // 2
                    if same(lo, mid):
                        lo = mid
                    else:
                        hi = mid
                return lo * bs  # block lo differs
            lo, step = hi, step * 2
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

    def key_of(self, tokens: Tokens, pos: int) -> int | bytes:
        """The children key of the block at tokens[pos:]: its token at block size 1, else its
        bytes (hashing a bytes object is one C call; a tuple would need an int per token)."""
        bs = self.block_size
        return tokens[pos] if bs == 1 else tokens[pos : pos + bs].tobytes()

    # --- hashes ---
    def hash_path(self, node: Node) -> tuple[int, ...]:
        """The chained hashes of `node`, computing them (and its ancestors') if not done yet."""
        if node.hashes is None:
            self._set_hashes(node, self._own_hashes(node))
        return node.hashes  # type: ignore[return-value]

    def _own_hashes(self, node: Node) -> tuple[int, ...]:
        """The chained hashes of unhashed `node` (its ancestors are hashed first), not set."""
        chain, parent = [], node.parent
        while parent.hashes is None:  # type: ignore[union-attr]  # the root's are ()
            chain.append(parent)
            parent = parent.parent  # type: ignore[union-attr]
        for n in reversed(chain):
            self._set_hashes(n, self._chained(n))
        return self._chained(node)

    def _chained(self, node: Node) -> tuple[int, ...]:
        parent_hashes = node.parent.hashes  # type: ignore[union-attr]
        parent_hash = parent_hashes[-1] if parent_hashes else None
        return tuple(self.hash_fn(node.ns, node.tokens, parent_hash))  # type: ignore[arg-type]

    def hash_all(self) -> None:
        for node in list(self.unhashed.values()):
            if node.hashes is None:
                self.hash_path(node)

    def path_hashes(self, node: Node) -> list[int]:
        """The chained hashes of every block on the path root..node."""
        if node.parent is not None:
            self.hash_path(node)
        out: list[int] = []
        for n in node.path():
            out += n.hashes  # type: ignore[arg-type]
        return out

    def block_hashes(self, block_ids: Sequence[int]) -> list[int]:
        """The chained hashes of cached blocks."""
        self.hash_all()  # then `owner` maps every cached block to its node
        return [self.hash_of_block(self.owner[b], b) for b in block_ids]

    def block_tokens(self, block_id: int) -> tuple[Namespace, Tokens]:
        """The namespace and the tokens of a cached block."""
        self.hash_all()
        node = self.owner[block_id]
        i = node.blocks.index(block_id) * self.block_size
        return node.ns, node.tokens[i : i + self.block_size]  # type: ignore[return-value]

    def hash_of_block(self, node: Node, block_id: int) -> int:
        """Hash of `block_id`, held by `node` or (after a split) by one of its ancestors."""
        while block_id not in node.blocks:
            if node.parent is None:
                raise LookupError(f"block {block_id} is no longer cached")
            node = node.parent
        return self.hash_path(node)[node.blocks.index(block_id)]

    def _set_hashes(self, node: Node, hashes: tuple[int, ...]) -> None:
        node.hashes = hashes
        del self.unhashed[node.id]
        self.pool.index_hashes(node.blocks, hashes)
        self.owner.update(dict.fromkeys(node.blocks, node))

    # --- insert ---
    def add_child(self, parent: Node, tokens: Tokens, blocks: list[int]) -> Node:
        """Hang a new node of `blocks` under `parent`; `tokens` is the whole sequence (root
        first), the node holds tokens[parent.end_depth:][: len(blocks) * bs]."""
        bs = self.block_size
        start = parent.end_depth
        own = tokens[start : start + len(blocks) * bs]
        key = own[0] if bs == 1 else own[:bs].tobytes()
        node = self._new_node(parent.ns, parent, key, blocks, own, None, start)
        parent.children[key] = node
        self.num_cached += len(blocks)
        self.unhashed[node.id] = node
        if self.hash_on_insert:
            self.hash_path(node)
        self.policy.on_insert(node, self.tick)
        if self.mrc is not None:
            self.mrc.total += len(blocks)
            node.units = self._units(parent, tokens, start, start + len(own))
            node.sampled = self._sampled(node.units)
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
        hashes = node.hashes
        upper = self._new_node(
            node.ns,
            parent,
            node.key,
            node.blocks[:k],
            node.tokens[: k * bs],
            None if hashes is None else hashes[:k],
            node.depth,
        )
        for attr in ("lock_ref", "pin_ref", "last_access", "last_used", "hits", "prio", "freq"):
            setattr(upper, attr, getattr(node, attr))
        upper.tokens_saved = node.tokens_saved * k // len(node.blocks)
        node.tokens_saved -= upper.tokens_saved
        parent.children[node.key] = upper
        node.blocks, node.tokens = node.blocks[k:], node.tokens[k * bs :]
        node.key, node.parent, node.depth = self.key_of(node.tokens, 0), upper, upper.end_depth
        upper.children[node.key] = node
        if hashes is None:
            self.unhashed[upper.id] = upper
        else:
            node.hashes = hashes[k:]
            self.owner.update(dict.fromkeys(upper.blocks, upper))
        if node.units:
            c = self._units_before(upper.depth, upper.end_depth)
            upper.units, node.units = node.units[:c], node.units[c:]
            upper.sampled, node.sampled = self._sampled(upper.units), self._sampled(node.units)
        return upper

    # --- miss-ratio sampling units ---
    def _units(self, parent: Node, tokens: Tokens, start: int, end: int) -> tuple:
        """Keys of the sampling units that end in tokens (start, end] (a new node's span)."""
        size = self.unit * self.block_size
        first = start // size  # units ending at or before `start` belong to the ancestors
        if first >= end // size:
            return ()
        if first == 0:
            prev = parent.ns.seed  # type: ignore[union-attr]
        else:
            holder = parent  # the node in which unit first - 1 ends
            while holder.depth >= first * size:
                holder = holder.parent  # type: ignore[assignment]
            prev = holder.units[first - 1 - holder.depth // size]
        return tuple(unit_keys(prev, tokens, first * size, end // size * size, size))

    def _units_before(self, depth: int, end: int) -> int:
        """Units that end in (depth, end]."""
        size = self.unit * self.block_size
        return end // size - depth // size

    def _sampled(self, units: tuple[int, ...]) -> tuple[int, ...]:
        if not units or min(units) >= self.unit_threshold:
            return ()
        return tuple(filter(self.unit_threshold.__gt__, units))

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
    def pop_victim(self, max_blocks: int, with_hashes: bool = True) -> Victim | None:
        """Evict up to max_blocks tail blocks of the lowest-priority evictable leaf."""
        node = self._pop_evictable()
        if node is None:
            return None
        if node.tail_prio is not None:  # listed by its tail's priority: only the tail goes
            max_blocks = 1
        return self._cut_tail(node, min(max_blocks, len(node.blocks)), with_hashes)

    def evict_node(self, node: Node, with_hashes: bool = True) -> Victim:
        """Evict all blocks of an evictable leaf."""
        self._unlist(node)
        return self._cut_tail(node, len(node.blocks), with_hashes)

    def _cut_tail(self, node: Node, n: int, with_hashes: bool) -> Victim:
        bs = self.block_size
        keep = len(node.blocks) - n
        hashes = node.hashes
        fresh = hashes is None and with_hashes  # hashed now: only the kept part gets indexed
        if fresh:
            hashes = self._own_hashes(node)
        victim = Victim(
            node,
            node.blocks[keep:],
            None if hashes is None else hashes[keep:],
            node.tokens[keep * bs :],
        )
        node.blocks, node.tokens = node.blocks[:keep], node.tokens[: keep * bs]
        self.num_cached -= n
        if fresh:
            if keep:
                self._set_hashes(node, hashes[:keep])  # type: ignore[index]
        elif hashes is not None:
            node.hashes = hashes[:keep]
            self._unindex(victim)
        if node.units:
            node.units = node.units[: self._units_before(node.depth, node.end_depth)]
            node.sampled = self._sampled(node.units)
        self.policy.record_eviction(node, victim.hashes)  # type: ignore[arg-type]
        node.tail_prio = None
        if keep:
            self._list(node)
        else:
            parent = node.parent
            assert parent is not None
            del parent.children[node.key]
            node.parent = None
            self.unhashed.pop(node.id, None)
            self._refresh(parent)
        return victim

    def _unindex(self, victim: Victim) -> None:
        assert victim.hashes is not None
        deque(map(self.owner.pop, victim.blocks), maxlen=0)
        self.pool.unindex_hashes(victim.blocks, victim.hashes)

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
        heapq.heappush(self.evictable, node.set_key)
        self.evictable_nodes[node.id] = node
        if len(self.evictable) > 2 * len(self.evictable_nodes) + 64:  # mostly stale: rebuild
            self.evictable = [n.set_key for n in self.evictable_nodes.values()]  # type: ignore[misc]
            heapq.heapify(self.evictable)

    def _unlist(self, node: Node) -> None:
        del self.evictable_nodes[node.id]
        node.set_key = None

    def _pop_evictable(self) -> Node | None:
        """The listed leaf of lowest (evict_prio, id), unlisted; None when there is none."""
        heap, listed = self.evictable, self.evictable_nodes
        while heap:
            key = heapq.heappop(heap)
            node = listed.get(key[1])
            if node is not None and node.set_key == key:
                del listed[key[1]]
                node.set_key = None
                return node
        return None

    def _new_node(self, ns, parent, key, blocks, tokens, hashes, depth) -> Node:  # noqa: ANN001
        self._next_id += 1
        return Node(self._next_id, ns, parent, key, blocks, tokens, hashes, depth)

    def iter_nodes(self) -> list[Node]:
        return list(self._walk_all())

    def _walk_all(self) -> Iterator[Node]:
        stack = list(self.roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
