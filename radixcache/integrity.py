"""check_integrity(): the invariants of DESIGN.md, recomputed from scratch (debug and tests)."""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixcache.block_pool import BlockPool
    from radixcache.radix_node import Node
    from radixcache.radix_tree import RadixTree


class IntegrityError(RuntimeError):
    """An invariant of the prefix cache does not hold."""


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise IntegrityError(message)


@dataclass(frozen=True)
class CacheParts:
    """What the checks read: the prefix cache's pool and tree."""

    pool: BlockPool
    tree: RadixTree
    num_blocks: int
    block_size: int
    max_pinned_blocks: int


def check_integrity(cache: CacheParts) -> None:
    """Block hashes are lazy: the checks cover what is hashed (it must chain from the root and
    be exactly what the hash index and `owner` hold) and that every other node is registered
    as unhashed, so hashing it later (as lookup_hash does for all) completes the index."""
    nodes = [n for n in cache.tree.iter_nodes() if n.parent is not None]
    _check_pool(cache, {b for n in nodes for b in n.blocks})
    for node in nodes:
        _check_node(cache, node)
    _check_units(cache)
    _check_hash_index(cache, nodes)
    _check_counters(cache, nodes)
    _check_evictable(cache, nodes)
    pool, tree = cache.pool, cache.tree
    evictable = tree.num_cached - tree.num_held
    total = pool.num_free() + evictable + pool.num_private() + tree.num_held
    _require(total == cache.num_blocks, f"occupancy adds up to {total}, not {cache.num_blocks}")


def _check_pool(cache: CacheParts, cached: set[int]) -> None:
    pool = cache.pool
    free = pool.free_ids()
    _require(len(set(free)) == len(free), "a block is on the free list twice")
    free_set = set(free)
    private = 0
    for b in range(cache.num_blocks):
        rc, owned = pool.refcount(b), pool.owned(b)
        _require(rc >= 0, f"block {b} has refcount {rc}")
        _require(owned == (b in cached), f"block {b}: owned={owned} but tree disagrees")
        if b in free_set:
            _require(rc == 0 and not owned, f"free block {b} is referenced or cached")
        elif owned:
            _require(rc == 0, f"cached block {b} also has private references")
        elif not owned:
            _require(rc > 0, f"block {b} is neither free, cached nor referenced (leaked)")
            private += 1
    _require(private == pool.num_private(), "private block counter is off")


def _check_node(cache: CacheParts, node: Node) -> None:
    bs, parent = cache.block_size, node.parent
    assert parent is not None
    n = len(node.blocks)
    _require(n > 0, f"{node} holds no blocks")
    _require(len(node.tokens) == n * bs, f"{node} has ragged fields")
    _require(parent.children.get(node.key) is node, f"{node} is not under its key")
    _require(node.key == cache.tree.key_of(node.tokens, 0), f"{node} key is not its first block")
    _require(node.ns == parent.ns, f"{node} crosses namespaces")
    _require(node.depth == parent.end_depth, f"{node} depth is off")
    _require(node.lock_ref >= 0 and node.pin_ref >= 0, f"{node} has a negative refcount")
    kids = node.children.values()
    _require(node.lock_ref >= sum(c.lock_ref for c in kids), f"{node} locked less than below")
    _require(node.pin_ref >= sum(c.pin_ref for c in kids), f"{node} pinned less than below")
    _require(type(node.tokens) is array and node.tokens.typecode == "q", f"{node} tokens type")
    tree = cache.tree
    if node.hashes is None:
        _require(tree.unhashed.get(node.id) is node, f"{node} is unhashed but not registered")
        return
    _require(node.id not in tree.unhashed, f"{node} is hashed but registered as unhashed")
    _require(parent.hashes is not None, f"{node} is hashed below an unhashed parent")
    _require(len(node.hashes) == n, f"{node} has ragged hashes")
    parent_hash = parent.hashes[-1] if parent.parent is not None else None  # type: ignore[index]
    expected = tree.hash_fn(node.ns, node.tokens, parent_hash)  # type: ignore[arg-type]
    _require(tuple(expected) == node.hashes, f"{node} hashes do not chain from its parent")


def _check_units(cache: CacheParts) -> None:
    """Each node's miss-ratio units and samples, recomputed along its path."""
    tree = cache.tree
    if tree.mrc is None:
        return
    stack = [
        (child, child.tokens) for root in tree.roots.values() for child in root.children.values()
    ]
    while stack:
        node, path_tokens = stack.pop()
        expected = tree._units(node.parent, path_tokens, node.depth, node.end_depth)  # type: ignore[arg-type]
        _require(node.units == expected, f"{node} miss-ratio units are stale")
        _require(node.sampled == tree._sampled(node.units), f"{node} samples are stale")
        stack += [(c, path_tokens + c.tokens) for c in node.children.values()]


def _check_hash_index(cache: CacheParts, nodes: list[Node]) -> None:
    tree, index = cache.tree, cache.pool.hash_index
    hash_of, owner = {}, {}
    for node in nodes:
        if node.hashes is not None:
            hash_of.update(zip(node.blocks, node.hashes, strict=True))
            owner.update(dict.fromkeys(node.blocks, node))
    for h, b in index.items():
        _require(hash_of.get(b) == h, f"hash index entry {h:x} -> {b} is not a hashed block")
    for b, h in hash_of.items():
        _require(h in index, f"hashed block {b} is missing from the hash index")
    _require(tree.owner == owner, "owner map differs from the hashed blocks' nodes")
    live = {id(n) for n in nodes}
    _require(all(id(n) in live for n in tree.unhashed.values()), "an evicted node is unhashed")


def _check_counters(cache: CacheParts, nodes: list[Node]) -> None:
    tree = cache.tree
    cached = sum(len(n.blocks) for n in nodes)
    _require(cached == tree.num_cached, f"cached blocks {tree.num_cached} != {cached}")
    locked = sum(len(n.blocks) for n in nodes if n.lock_ref > 0)
    pinned = sum(len(n.blocks) for n in nodes if n.pin_ref > 0)
    held = sum(len(n.blocks) for n in nodes if n.lock_ref > 0 or n.pin_ref > 0)
    _require(locked == tree.num_locked, f"locked blocks {tree.num_locked} != {locked}")
    _require(pinned == tree.num_pinned, f"pinned blocks {tree.num_pinned} != {pinned}")
    _require(held == tree.num_held, f"held blocks {tree.num_held} != {held}")
    _require(pinned <= cache.max_pinned_blocks, "pinned blocks exceed the cap")


def _check_evictable(cache: CacheParts, nodes: list[Node]) -> None:
    tree = cache.tree
    want = {n.id for n in nodes if not n.children and n.lock_ref == 0 and n.pin_ref == 0}
    _require(want == set(tree.evictable_nodes), "evictable set differs from the evictable leaves")
    keys = {(n.evict_prio, n.id) for n in tree.evictable_nodes.values()}
    _require(keys <= set(tree.evictable), "a listed leaf is missing from the eviction heap")
    for n in tree.evictable_nodes.values():
        _require(n.set_key == (n.evict_prio, n.id), f"{n} changed priority while listed")
