"""Pinned prefixes: pin references on tree paths, capped at a share of the pool."""

from __future__ import annotations

from array import array

from radixcache.hashing import Namespace
from radixcache.radix_node import Node
from radixcache.radix_tree import RadixTree


class PinRegistry:
    """Each pin(ns, tokens) holds one pin reference on a path until unpin(ns, same tokens)."""

    def __init__(self, tree: RadixTree, max_blocks: int) -> None:
        self.tree = tree
        self.max_blocks = max_blocks
        self._held: dict[tuple[Namespace, bytes], list[Node]] = {}

    def pin(self, ns: Namespace, tokens: array) -> int:
        """Pin the cached prefix of `tokens` (as much as the cap allows); tokens pinned."""
        n = len(tokens) // self.tree.block_size
        walk = self.tree.walk(ns, tokens, n)
        node = self._trim_to_cap(walk.path) if walk.path else walk.node
        if node.parent is None:
            return 0
        self.tree.add_refs(node, 0, 1)
        self._held.setdefault(self._key(ns, tokens), []).append(node)
        return node.end_depth

    def unpin(self, ns: Namespace, tokens: array) -> int:
        """Undo one earlier pin of the same tokens; tokens unpinned."""
        key = self._key(ns, tokens)
        held = self._held.get(key)
        if not held:
            return 0
        node = held.pop()
        if not held:
            del self._held[key]
        self.tree.add_refs(node, 0, -1)
        return node.end_depth

    def _key(self, ns: Namespace, tokens: array) -> tuple[Namespace, bytes]:
        bs = self.tree.block_size
        return ns, tokens[: len(tokens) // bs * bs].tobytes()

    def _trim_to_cap(self, path: list[Node]) -> Node:
        room = self.max_blocks - self.tree.num_pinned
        for node in path:
            extra = len(node.blocks) if node.pin_ref == 0 else 0
            if extra > room:
                return self.tree.split(node, room) if room > 0 else node.parent  # type: ignore[return-value]
            room -= extra
        return path[-1]
