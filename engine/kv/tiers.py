"""Moves KV bytes between the paged device pool and the spill tiers (TieredStore); a listener of
the KV cache manager: evicted blocks spill down, committed ones go to a write-through tier.

It knows blocks by id and hash only; which sequence or tree node they belong to is the manager's
business."""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from engine.kv.hybrid_cache import HybridKVCache
from engine.kv.tier_format import AsPool, TierFormat
from radixcache.window_blocks import NULL_BLOCK
from storage.pacing import STEP_SHARE

if TYPE_CHECKING:
    from engine.kv.listeners import Committed
    from engine.kv.paged_cache import KVCache
    from radixcache.hashing import Namespace
    from radixcache.results import EvictedBlock
    from radixcache.window_blocks import WindowBlocks
    from storage.tiered import LoadResult, PendingLoad, TieredStore


@dataclass
class TierLoad:
    """One sequence's prefix coming back from the spill tiers: the loader thread reads it
    (`pending`), then the engine copies what `arrived` into the device blocks `block_ids` (a
    hybrid cache: the windowed layers' part into `window_ids`, where not the null block), a few
    per step; `written` of them are in."""

    pending: PendingLoad
    arrived: LoadResult | None = None
    block_ids: list[int] = field(default_factory=list)
    window_ids: list[int] = field(default_factory=list)
    written: int = 0

    @property
    def installed(self) -> bool:
        return self.arrived is not None and self.written == len(self.block_ids)


class KVTiers:
    """With a hybrid KV cache a stored block holds every layer's KV, in layer order: a block
    whose windowed twin was evicted on its own is not spilled (a load stops there, and what
    follows is recomputed).

    `fmt` (--tier-kv-dtype) says what the tiers hold of a device block and under which
    namespace: the manager's namespaces are the device's, the store sees fmt.namespace's."""

    def __init__(
        self,
        store: TieredStore,
        kv_cache: KVCache,
        windows: WindowBlocks | None = None,
        fmt: TierFormat | None = None,
    ) -> None:
        self.store = store
        self.kv_cache = kv_cache
        self.windows = windows
        self.fmt = AsPool() if fmt is None else fmt
        t = kv_cache.tensor
        num_layers = t.shape[0]
        if isinstance(kv_cache, HybridKVCache):
            num_layers += kv_cache.window_tensor.shape[0]
        pool_shape = (num_layers, t.shape[1], *t.shape[3:])  # [layers, 2, bs, Hkv, row]
        self.block_shape = self.fmt.block_shape(pool_shape)  # what the tiers store
        # while sequences decode, loaded blocks are copied in for at most this share of a step
        # (at least one block a step), so a long load goes in over a few steps, not one stall
        self.install_share = STEP_SHARE
        self.pacer = store.pacer  # its step time sizes that share
        moved = self.fmt.install_bytes(math.prod(pool_shape), t.element_size())
        self._copy_s = moved / 4e9  # per block (EMA)

    def _block_kv(self, block_id: int, window_block: int) -> torch.Tensor | None:
        """A device block as the tiers store it (None: its windowed twin is gone)."""
        if isinstance(self.kv_cache, HybridKVCache):
            if window_block == NULL_BLOCK:
                return None
            return self.fmt.down(self.kv_cache.block_kv(block_id, window_block))
        return self.fmt.down(self.kv_cache.tensor[:, :, block_id])

    # --- CacheListener ---
    def blocks_evicted(self, evicted: list[EvictedBlock]) -> None:
        """Write-back: queues evicted blocks for the tiers. The store copies their KV before
        returning, so the caller may reuse the ids at once."""
        by_ns: dict[Namespace, list] = defaultdict(list)
        for b in evicted:
            kv = self._block_kv(b.block_id, b.window_block)
            if kv is not None:
                by_ns[b.namespace].append((b.block_hash, kv))
        for ns, items in by_ns.items():
            self.store.store(self.fmt.namespace(ns), items)

    def blocks_committed(self, committed: Committed) -> None:
        """Write-through: freshly computed tree blocks go to the shared tier at once."""
        if not self.store.write_through or committed.loaded or not committed.new:
            return
        items = []
        for i in committed.new:
            f = committed.block_ids[i]
            twin = self.windows.twin_of(f) if self.windows is not None else NULL_BLOCK
            kv = self._block_kv(f, twin)
            if kv is None:
                break  # hashes chain: a block after a missing one could not be loaded
            items.append((committed.hashes[i], kv))
        if items:
            self.store.publish(self.fmt.namespace(committed.ns), items)

    def retain(self, ns: Namespace, hashes: list[int], block_ids: list[int]) -> None:
        """A retained request's prefix (tree blocks, in order) goes to the persistent tier."""
        items = []
        for h, f in zip(hashes, block_ids, strict=True):
            twin = self.windows.twin_of(f) if self.windows is not None else NULL_BLOCK
            kv = self._block_kv(f, twin)
            if kv is None:
                break  # hashes chain: a block after a missing one could not be loaded
            items.append((h, kv))
        if items:
            self.store.retain(self.fmt.namespace(ns), items)

    def twins_evicted(self, block_hashes: list[int]) -> None:
        """Nothing to spill: the block goes down whole, with its twin, or not at all."""

    # --- loads ---
    def step_started(self, decoding: bool) -> None:
        """Paces the loader to a share of each step while sequences decode (storage.pacing)."""
        self.store.step_started(decoding)

    def start_load(self, ns: Namespace, hashes: list[int]) -> TierLoad:
        """Starts loading the longest run of leading `hashes` the tiers hold (off this thread)."""
        tier_ns = self.fmt.namespace(ns)
        return TierLoad(self.store.start_load(tier_ns, hashes, shape=self.block_shape))

    def write_some(self, load: TierLoad, decoding: bool) -> None:
        """Copies the next arrived blocks into their device blocks: while sequences decode, as
        many as fit in install_share of a step (at least one), else all."""
        assert load.arrived is not None
        start = load.written
        end = len(load.block_ids)
        if decoding:
            budget = self.install_share * self.pacer.step_s
            end = min(end, start + max(1, int(budget / self._copy_s)))
        if end == start:
            return
        ids, arrived = load.block_ids[start:end], load.arrived.blocks[start:end]
        t0 = time.perf_counter()
        kv_cache = self.kv_cache
        blocks = [self.fmt.up(kv, kv_cache.tensor) for kv in arrived]
        if isinstance(kv_cache, HybridKVCache):
            for f, w, kv in zip(ids, load.window_ids[start:end], blocks, strict=True):
                kv_cache.write_block(f, w, kv)
        else:
            kv_cache.write_blocks(ids, blocks)
        self._copy_s += 0.3 * ((time.perf_counter() - t0) / (end - start) - self._copy_s)
        load.written = end

    def lookup(self, ns: Namespace, hashes: list[int]) -> dict[str, int]:
        """Tokens of the leading run of `hashes` per tier (no data read)."""
        return self.store.lookup_tokens(self.fmt.namespace(ns), hashes)

    def close(self) -> None:
        """Finishes queued tier writes and stops the tier threads."""
        self.store.close()
