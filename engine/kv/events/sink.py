"""KVEventSink: turns changes of the cached set into vLLM KV events and offers them to the
publisher. The KV cache manager reports device-tier changes; the TieredStore reports the tiers below
(it calls `stored` / `removed` with a tier name, see storage.writer.TierObserver).

Block hashes are the tree's chained xxh3 hashes; a tenant's cache_salt is mixed into the
namespace seed of the first block of every chain, so it never appears in an event. The lower
tiers know blocks by hash only, so their BlockStored events carry no token ids (as vLLM's
offloading tiers do).

A hybrid model's (sliding-window layers in a pool of their own) device events say which half of a
block they are about, in vLLM's fields: group 0 the full-attention layers, group 1 the windowed
ones (kind "sliding_window" and the window); a twin evicted on its own removes only group 1.
The tiers below hold whole blocks: their events carry no group."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixcache.shared.kv_events_wire import MEDIUM, AllBlocksCleared, BlockRemoved, BlockStored
from radixcache.shared.tier_names import TierName

if TYPE_CHECKING:
    from engine.kv.events.publisher import ZmqEventPublisher
    from engine.kv.listeners import Committed
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock


FULL_GROUP, WINDOW_GROUP = 0, 1


@dataclass(frozen=True)
class GroupSpec:
    """vLLM's KV-cache group fields of an event."""

    idx: int
    kind: str
    sliding_window: int | None


class KVEventSink:
    def __init__(
        self, publisher: ZmqEventPublisher, block_size: int, window: int | None = None
    ) -> None:
        """`window`: the sliding-window layers' window of a hybrid cache (None: one pool)."""
        self.publisher = publisher
        self.block_size = block_size
        self.groups: tuple[GroupSpec | None, ...] = (None,)
        if window is not None:
            self.groups = (
                GroupSpec(FULL_GROUP, "full_attention", None),
                GroupSpec(WINDOW_GROUP, "sliding_window", window),
            )

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
                for group in self.groups:
                    event = _stored(hashes[first:end], parent, run, bs, TierName.DEVICE, group)
                    self.publisher.offer(event)
                start = k

    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None:
        """Blocks that left the tree."""
        if not evicted:
            return
        hashes = [b.block_hash for b in evicted]
        if len(self.groups) == 1:
            self.publisher.offer(BlockRemoved(hashes, MEDIUM[TierName.DEVICE]))
            return
        self.publisher.offer(BlockRemoved(hashes, MEDIUM[TierName.DEVICE], group_idx=FULL_GROUP))
        self.twins_evicted([b.block_hash for b in evicted if b.window_block])

    def twins_evicted(self, block_hashes: list[int]) -> None:
        if block_hashes:
            event = BlockRemoved(
                list(block_hashes), MEDIUM[TierName.DEVICE], group_idx=WINDOW_GROUP
            )
            self.publisher.offer(event)

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
    hashes: list[int],
    parent: int | None,
    tokens: list[int],
    block_size: int,
    tier: str,
    group: GroupSpec | None = None,
) -> BlockStored:
    event = BlockStored(
        block_hashes=list(hashes),
        parent_block_hash=parent,
        token_ids=list(tokens),
        block_size=block_size,
        lora_id=None,
        medium=MEDIUM.get(tier, tier.upper()),
        lora_name=None,
    )
    if group is not None:
        event.group_idx = group.idx
        event.kv_cache_spec_kind = group.kind
        event.kv_cache_spec_sliding_window = group.sliding_window
    return event
