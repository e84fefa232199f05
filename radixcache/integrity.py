"""check_integrity(): the invariants of DESIGN.md, recomputed from scratch (debug and tests)."""

from __future__ import annotations

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
    """What the checks read: the prefix cache's pool, tree and private-lock map."""

    pool: BlockPool
    tree: RadixTree
    private_locks: dict[int, Node]
    num_blocks: int
    block_size: int
    max_pinned_blocks: int


def check_integrity(cache: CacheParts) -> None:
    _check_pool(cache)
    nodes = [n for n in cache.tree.iter_nodes() if n.parent is not None]
    for node in nodes:
        _check_node(cache, node)
    _check_hash_index(cache)
    _check_counters(cache, nodes)
    _check_evictable(cache, nodes)
    _check_private_locks(cache)
    pool, tree = cache.pool, cache.tree
    evictable = len(tree.block_node) - tree.num_held
    total = pool.num_free() + evictable + pool.num_private() + tree.num_held
    _require(total == cache.num_blocks, f"occupancy adds up to {total}, not {cache.num_blocks}")


def _check_pool(cache: CacheParts) -> None:
    pool, tree = cache.pool, cache.tree
    free = pool.free_ids()
    _require(len(set(free)) == len(free), "a block is on the free list twice")
    free_set = set(free)
    private = 0
    for b in range(cache.num_blocks):
        rc, owned = pool.refcount[b], pool.owned[b]
        _require(rc >= 0, f"block {b} has refcount {rc}")
        _require(owned == (b in tree.block_node), f"block {b}: owned={owned} but tree disagrees")
        if b in free_set:
            _require(rc == 0 and not owned, f"free block {b} is referenced or cached")
        elif not owned:
            _require(rc > 0, f"block {b} is neither free, cached nor referenced (leaked)")
            private += 1
    _require(private == pool.num_private(), "private block counter is off")


def _check_node(cache: CacheParts, node: Node) -> None:
    bs, parent = cache.block_size, node.parent
    assert parent is not None
    n = len(node.blocks)
    _require(n > 0, f"{node} holds no blocks")
    _require(len(node.tokens) == n * bs and len(node.hashes) == n, f"{node} has ragged fields")
    _require(parent.children.get(node.key) is node, f"{node} is not under its key")
    _require(node.key == tuple(node.tokens[:bs]), f"{node} key is not its first block")
    _require(node.ns == parent.ns, f"{node} crosses namespaces")
    _require(node.depth == parent.end_depth, f"{node} depth is off")
    _require(node.lock_ref >= 0 and node.pin_ref >= 0, f"{node} has a negative refcount")
    kids = node.children.values()
    _require(node.lock_ref >= sum(c.lock_ref for c in kids), f"{node} locked less than below")
    _require(node.pin_ref >= sum(c.pin_ref for c in kids), f"{node} pinned less than below")
    for b in node.blocks:
        _require(cache.tree.block_node.get(b) is node, f"block {b} is not mapped to {node}")
    mrc = cache.tree.mrc
    if mrc is not None:
        _require(node.sampled == mrc.sample(node.hashes), f"{node} sampled hashes are stale")
    parent_hash = parent.hashes[-1] if parent.parent is not None else None
    expected = cache.tree.hash_fn(node.ns, node.tokens, parent_hash)  # type: ignore[arg-type]
    _require(tuple(expected) == node.hashes, f"{node} hashes do not chain from its parent")


def _check_hash_index(cache: CacheParts) -> None:
    tree = cache.tree
    hash_of = {}
    for b, node in tree.block_node.items():
        hash_of[b] = node.hashes[node.blocks.index(b)]
    for h, b in tree.hash_index.items():
        _require(hash_of.get(b) == h, f"hash index entry {h:x} -> {b} is not a cached block")
    for b, h in hash_of.items():
        _require(h in tree.hash_index, f"cached block {b} is missing from the hash index")


def _check_counters(cache: CacheParts, nodes: list[Node]) -> None:
    tree = cache.tree
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
    _require(keys == set(tree.evictable) and len(keys) == len(tree.evictable), "stale set keys")
    for n in tree.evictable_nodes.values():
        _require(n.set_key == (n.evict_prio, n.id), f"{n} changed priority while listed")


def _check_private_locks(cache: CacheParts) -> None:
    pool = cache.pool
    for b in range(cache.num_blocks):
        shared = pool.owned[b] and pool.refcount[b] > 0
        _require(shared == (b in cache.private_locks), f"block {b} private lock bookkeeping")
    for b, node in cache.private_locks.items():
        _require(node.lock_ref > 0 and node.parent is not None, f"block {b} lock was dropped")
