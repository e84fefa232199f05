"""A node of the radix tree: a run of cached blocks of one namespace."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixcache.hashing import Namespace


class Node:
    """A compressed edge: `blocks[i]` holds the KV of `tokens[i * bs : (i + 1) * bs]`.

    `hashes[i]` is the chained hash of block i, or `hashes` is None until someone needs them
    (RadixTree.hash_path computes them once; a hashed node's ancestors are hashed too).
    `depth` counts the tokens above this node.
    `tokens` is an array("q") (token runs compare as memory). `key` is the node's slot in
    `parent.children`: its first block's tokens (RadixTree.key_of: the token id at block size 1,
    else the block's bytes).
    `lock_ref`/`pin_ref` count the handles that hold the path root..this node.
    `prio` is the eviction priority the policy gave it (lower goes first); `tail_prio`, when the
    policy sets it, is the priority of the node's last block until that block is first read or
    evicted (a request's last block is rarely read again). `set_key` is the node's entry in the
    evictable set, or None when it is not evictable. `units` are the miss-ratio curve's keys of
    the sampling units that end in this node, `sampled` those of them the curve samples.
    """

    __slots__ = (
        "id",
        "ns",
        "parent",
        "key",
        "children",
        "blocks",
        "tokens",
        "hashes",
        "depth",
        "lock_ref",
        "pin_ref",
        "last_access",
        "last_used",
        "hits",
        "tokens_saved",
        "prio",
        "tail_prio",
        "freq",
        "units",
        "sampled",
        "set_key",
    )

    def __init__(
        self,
        node_id: int,
        ns: Namespace | None,
        parent: Node | None,
        key: int | bytes,
        blocks: list[int],
        tokens: array,
        hashes: tuple[int, ...] | None,
        depth: int,
    ) -> None:
        self.id = node_id
        self.ns = ns
        self.parent = parent
        self.key = key
        self.children: dict[int | bytes, Node] = {}
        self.blocks = blocks
        self.tokens = tokens
        self.hashes = hashes
        self.depth = depth
        self.lock_ref = 0
        self.pin_ref = 0
        self.last_access = 0
        self.last_used = 0.0
        self.hits = 0
        self.tokens_saved = 0
        self.prio: float = 0.0
        self.tail_prio: float | None = None
        self.freq = 1  # the policy's reference count (may include ghost history)
        self.units: tuple[int, ...] = ()
        self.sampled: tuple[int, ...] = ()
        self.set_key: tuple[float, int] | None = None

    @property
    def evict_prio(self) -> float:
        """The priority of the block eviction takes next (the tail)."""
        return self.prio if self.tail_prio is None else self.tail_prio

    @property
    def end_depth(self) -> int:
        return self.depth + len(self.tokens)

    def path(self) -> list[Node]:
        """Nodes from the first below the root down to this one."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None and node.parent is not None:
            out.append(node)
            node = node.parent
        out.reverse()
        return out

    def __repr__(self) -> str:
        return f"Node(id={self.id}, blocks={len(self.blocks)}, depth={self.depth})"
