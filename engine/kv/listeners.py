"""What the KV cache manager tells the parts that follow the device tree's contents."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock


@dataclass(frozen=True)
class Committed:
    """Blocks that entered the tree in one commit: positions `new` of a path whose block hashes
    are `hashes` and tokens `tokens`; `kept` are the positions whose block is ours (the tree did
    not already hold a copy); `loaded` when they came back from a spill tier."""

    ns: Namespace
    hashes: list[int]
    block_ids: list[int]  # the tree's ids, the whole path
    tokens: list[int]
    new: range
    kept: list[int]
    loaded: bool


class CacheListener(Protocol):
    """A hybrid cache's blocks have two halves (full-attention and sliding-window layers):
    committed and evicted blocks carry both, a twin evicted on its own is told apart."""

    def blocks_committed(self, committed: Committed) -> None: ...

    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None: ...

    def twins_evicted(self, block_hashes: list[int]) -> None:
        """Cached blocks whose sliding-window layers' part was evicted (a hybrid cache)."""
