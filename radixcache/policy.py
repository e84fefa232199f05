"""Eviction policies: each gives a node a priority; the lowest evictable leaf goes first."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixcache.radix_node import Node


class EvictionPolicy(Protocol):
    """What the tree asks of a policy. Priorities only change inside these calls."""

    name: str

    def on_access(self, node: Node, tick: int) -> None:
        """`node` was inserted or matched at logical time `tick`: set `node.prio`."""

    def on_evict(self, node: Node) -> None:
        """Blocks of `node` (priority `node.prio`) were just evicted."""


class LRUPolicy:
    """Least recently used first."""

    name = "lru"

    def on_access(self, node: Node, tick: int) -> None:
        node.prio = tick

    def on_evict(self, node: Node) -> None:
        pass
