"""What the PrefixCache returns (NamedTuples, as in mini-sglang)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from radixcache.hashing import Namespace
from radixcache.radix_node import Node

NodeHandle = Node


class MatchResult:
    """block_ids, num_tokens, handle (lock it) and last_hash: the chained hash of the last
    matched block (None when nothing matched). last_hash is computed on first read, as only a
    caller that goes on to the spill tiers needs it; read it before the tree changes."""

    __slots__ = ("block_ids", "num_tokens", "handle", "_last_hash", "_hash_of")

    def __init__(
        self,
        block_ids: list[int],
        num_tokens: int,
        handle: NodeHandle,
        hash_of: Callable[[], int] | None = None,
    ) -> None:
        self.block_ids = block_ids
        self.num_tokens = num_tokens
        self.handle = handle
        self._last_hash: int | None = None
        self._hash_of = hash_of

    @property
    def last_hash(self) -> int | None:
        if self._hash_of is not None:
            self._last_hash, self._hash_of = self._hash_of(), None
        return self._last_hash

    def __iter__(self) -> Iterator:  # unpacks like the NamedTuple it was
        return iter((self.block_ids, self.num_tokens, self.handle, self.last_hash))

    def __repr__(self) -> str:
        return f"MatchResult(blocks={len(self.block_ids)}, num_tokens={self.num_tokens})"


class InsertResult(NamedTuple):
    block_ids: list[int]  # the tree's ids for all the caller's blocks
    handle: NodeHandle  # deepest node: lock it, then unlock the old handle
    duplicates: list[int]  # caller blocks the tree already held: still private, free them


class EvictedBlock(NamedTuple):
    block_id: int
    namespace: Namespace
    block_hash: int
    tokens: list[int]
    window_block: int = 0  # its windowed layers' twin (a hybrid cache), 0: none


class StaleHandleError(ValueError):
    """A handle whose node was evicted (it was used without being locked)."""
