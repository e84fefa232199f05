"""Plain counters and snapshots of the prefix cache (exported at the edge, not in the hot path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixcache.hashing import Namespace
from radixcache.radix_node import Node
from radixcache.window_blocks import WindowStats


@dataclass
class NamespaceStats:
    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0
    inserted_blocks: int = 0
    evicted_blocks: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass(frozen=True)
class MissRatioPoint:
    size_blocks: int
    size_ratio: float  # size_blocks / the pool's num_blocks
    hit_rate: float  # estimated LRU block hit rate at that size


@dataclass
class CacheStats:
    num_blocks: int
    block_size: int
    free: int
    evictable: int
    referenced: int  # private blocks + cached blocks on a locked path
    pinned: int  # cached blocks on a pinned, unlocked path
    cached: int
    policy: str
    hash_collisions: int
    namespaces: dict[Namespace, NamespaceStats] = field(default_factory=dict)
    miss_ratio_curve: list[MissRatioPoint] = field(default_factory=list)
    windows: WindowStats | None = None  # the sliding-window layers' pool (hybrid models)

    def total(self) -> NamespaceStats:
        out = NamespaceStats()
        for s in self.namespaces.values():
            out.lookups += s.lookups
            out.lookup_tokens += s.lookup_tokens
            out.hit_tokens += s.hit_tokens
            out.inserted_blocks += s.inserted_blocks
            out.evicted_blocks += s.evicted_blocks
        return out


@dataclass(frozen=True)
class PrefixInfo:
    namespace: Namespace
    num_tokens: int  # length of the prefix root..node
    hits: int  # matches that used the whole node
    tokens_saved: int  # tokens of this node served from cache
    last_used: float  # time.time() of the last access
    locked: bool
    pinned: bool
    token_ids: list[int]  # the first `preview` tokens of the prefix


def prefix_info(node: Node, preview: int) -> PrefixInfo:
    tokens: list[int] = []
    for part in node.path():
        if len(tokens) >= preview:
            break
        tokens += part.tokens[: preview - len(tokens)]  # an array("q") slice onto the list
    assert node.ns is not None
    return PrefixInfo(
        namespace=node.ns,
        num_tokens=node.end_depth,
        hits=node.hits,
        tokens_saved=node.tokens_saved,
        last_used=node.last_used,
        locked=node.lock_ref > 0,
        pinned=node.pin_ref > 0,
        token_ids=tokens,
    )
