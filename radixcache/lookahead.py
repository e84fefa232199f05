"""Tree lookahead: what the radix tree holds after a sequence's committed blocks and its tail.

A sequence whose committed blocks end at `node` and whose uncommitted tail is `tail` continues,
as far as the cache knows, into the child of `node` whose tokens start with `tail`, then down that
child's most recently used descendants. A retried or repeated request finds its whole earlier
continuation there; the model checks every token of it anyway."""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from radixcache.radix_node import Node

MAX_CHILDREN_SCANNED = 64  # a node with more (a namespace root, say) is not searched


def continuation(node: Node, tail: array, limit: int) -> array:
    """Up to `limit` cached tokens after node's path + tail (empty when none continue it)."""
    out = array("q")
    if limit <= 0 or len(node.children) > MAX_CHILDREN_SCANNED:
        return out
    n = len(tail)
    child = next((c for c in node.children.values() if c.tokens[:n] == tail), None)
    if child is None or len(child.tokens) <= n:
        return out
    out.extend(child.tokens[n : n + limit])
    while len(out) < limit and child.children:
        child = max(child.children.values(), key=lambda c: c.last_access)
        out.extend(child.tokens[: limit - len(out)])
    return out
