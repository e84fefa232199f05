"""What the PrefixCache returns (NamedTuples, as in mini-sglang)."""

from __future__ import annotations

from typing import NamedTuple

from radixcache.hashing import Namespace
from radixcache.radix_node import Node

NodeHandle = Node


class MatchResult(NamedTuple):
    block_ids: list[int]
    num_tokens: int
    handle: NodeHandle
    last_hash: int | None  # chained hash of the last matched block


class InsertResult(NamedTuple):
    block_ids: list[int]  # the tree's ids for all the caller's blocks
    handle: NodeHandle  # deepest node: lock it, then unlock the old handle
    duplicates: list[int]  # caller blocks the tree already held: still private, free them


class EvictedBlock(NamedTuple):
    block_id: int
    namespace: Namespace
    block_hash: int
    tokens: list[int]


class StaleHandleError(ValueError):
    """A handle whose node was evicted (it was used without being locked)."""
