"""KVEventSink: turns changes of the cached set into vLLM KV events and offers them to the
publisher. The KV cache manager reports device-tier changes; the TieredStore reports the tiers below
(it calls `stored` / `removed` with a tier name, see storage.writer.TierObserver).

Block hashes are the tree's chained xxh3 hashes; a tenant's cache_salt is mixed into the
namespace seed of the first block of every chain, so it never appears in an event. The lower
tiers know blocks by hash only, so their BlockStored events carry no token ids (as vLLM's
offloading tiers do)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixcache.kv_events_wire import MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored
from radixcache.tier_names import TierName

if TYPE_CHECKING:
    from engine.kv.listeners import Committed
    from engine.kv_events.publisher import ZmqEventPublisher
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock


class KVEventSink:
    def __init__(self, publisher: ZmqEventPublisher, block_size: int) -> None:
        self.publisher = publisher
        self.block_size = block_size

    # --- engine.kv.listeners.CacheListener (the device tier) ---
    def blocks_committed(self, committed: Committed) -> None:
        """The blocks at `committed.kept` are newly in the tree; one BlockStored per run."""
        positions, hashes, tokens = committed.kept, committed.hashes, committed.tokens
        bs, start = self.block_size, 0
        for k in range(1, len(positions) + 1):
            if k == len(positions) or positions[k] != positions[k - 1] + 1:
                first, end = positions[start], positions[k - 1] + 1
                parent = hashes[first - 1] if first > 0 else None
                run = tokens[first * bs : end * bs]
                self.publisher.offer(_stored(hashes[first:end], parent, run, bs, TierName.DEVICE))
                start = k

    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None:
        """Blocks that left the tree."""
        if evicted:
            hashes = [b.block_hash for b in evicted]
            self.publisher.offer(BlockRemoved(hashes, MEDIUM[TierName.DEVICE]))

    def cache_cleared(self) -> None:
        self.publisher.offer(AllBlocksCleared())

    # --- storage.writer.TierObserver ---
    def stored(self, tier: str, ns: Namespace, hashes: list[int]) -> None:
        if hashes:
            self.publisher.offer(_stored(hashes, None, [], ns.block_size, tier))

    def removed(self, tier: str, ns: Namespace, hashes: list[int]) -> None:
        if hashes:
            self.publisher.offer(BlockRemoved(list(hashes), MEDIUM.get(tier, tier.upper())))


def _stored(
    hashes: list[int], parent: int | None, tokens: list[int], block_size: int, tier: str
) -> BlockStored:
    return BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=block_size,
        lora_id=None,
        medium=MEDIUM.get(tier, tier.upper()),
        lora_name=None,
    )
