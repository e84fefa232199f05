"""TierWriter: the one background thread that writes to the tiers, behind a bounded queue.

Jobs are (kind, target tier, namespace, items):
  "new"      evicted KV tensors -> the top tier (and Redis too when write-through)
  "publish"  freshly computed KV tensors -> Redis (write-through)
  "put"      encoded values -> `target` (spills of a tier's evictions, promotions)
  "retain"   a retained prefix's KV tensors -> `target`, the persistent tier, marked retained
Queued blocks are capped at `capacity`; over it a job is dropped and counted, never waited for.
Every completed write is reported to the `observer` (KV events), on this thread.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import TYPE_CHECKING, Protocol

import torch

from radixcache.shared.tier_names import TierName
from storage.base import RetainingTier, Tier
from storage.codec import encode_block, stored_format
from storage.transfer import DeviceCopies, Ready, ready_now

if TYPE_CHECKING:
    from radixcache.hashing import Namespace
    from storage.store_stats import StoreStats

# (kind, target, namespace, items, ready: waits until the items' host copies are complete)
_Job = tuple[str, Tier | None, "Namespace", list, Ready]


class TierObserver(Protocol):
    """Told of every change of a tier's contents (called on the tier threads; must not block)."""

    def stored(self, tier: str, ns: Namespace, hashes: list[int]) -> None: ...

    def removed(self, tier: str, ns: Namespace, hashes: list[int]) -> None: ...


class TierWriter:
    def __init__(
        self,
        tiers: list[Tier],
        write_through: bool,
        capacity: int,
        stats: StoreStats,
        observer: TierObserver | None = None,
        copies: DeviceCopies | None = None,
    ):
        self.tiers = tiers
        self.observer = observer
        self.copies = DeviceCopies() if copies is None else copies
        self.redis = (
            next((t for t in tiers if t.name == TierName.REDIS), None) if write_through else None
        )
        self.capacity = capacity
        self.stats = stats
        self.pending = 0  # blocks queued, not yet written
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._loop, name="tier-writer", daemon=True)
        self._thread.start()

    def enqueue_tensors(
        self, kind: str, target: Tier | None, ns: Namespace, items: list[tuple[int, torch.Tensor]]
    ) -> None:
        """Copies the tensors now (they may be views of the device pool; on a GPU the copies run
        on a side stream and this does not wait for them), writes them later."""
        if not items or not self._reserve(len(items)):
            return
        host, ready = self.copies.snapshot([kv for _, kv in items])
        self.stats.stored_blocks += len(items)
        self._queue.put(
            (kind, target, ns, list(zip([h for h, _ in items], host, strict=True)), ready)
        )

    def put(self, target: Tier, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        """Encoded values for `target`; written inline when called on the writer thread itself."""
        if threading.current_thread() is self._thread:
            self._put(target, ns, items)
        elif items and self._reserve(len(items)):
            self._queue.put(("put", target, ns, items, ready_now))

    def wait_idle(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float) -> None:
        self.wait_idle(timeout)
        self._queue.put(None)
        self._thread.join(timeout)

    def _reserve(self, n: int) -> bool:
        with self._lock:
            if self.pending + n > self.capacity:
                self.stats.dropped_blocks += n
                return False
            self.pending += n
            return True

    def _loop(self) -> None:
        while (job := self._queue.get()) is not None:
            kind, target, ns, items, ready = job
            try:
                ready()
                if kind == "new":
                    encoded = self._write_missing(self.tiers[0], ns, items)
                    if self.redis is not None and self.redis is not self.tiers[0]:
                        self._write_missing(self.redis, ns, items, encoded)
                elif kind == "publish":
                    self._write_missing(target, ns, items)
                elif kind == "retain":
                    self._retain(target, ns, items)
                else:
                    self._put(target, ns, items)
            except Exception:  # a tier bug must not kill the writer; count it on the tier
                (target or self.tiers[0]).stats.errors += 1
            finally:
                with self._lock:
                    self.pending -= len(items)
                self._queue.task_done()
        self._queue.task_done()

    def _put(self, tier: Tier, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        tier.put(ns, items)
        if self.observer is not None and items:
            self.observer.stored(tier.name, ns, [h for h, _ in items])

    def _retain(
        self, tier: RetainingTier, ns: Namespace, items: list[tuple[int, torch.Tensor]]
    ) -> None:
        """Every block is encoded (a tier may rewrite a present one to set its expiry); the
        observer hears of those the tier lacked (as _put: written or refused)."""
        hashes = [h for h, _ in items]
        present = tier.contains(ns, hashes) if self.observer is not None else []
        fmt = stored_format(ns.kv_dtype)
        tier.retain(ns, [(h, encode_block(kv, fmt)) for h, kv in items])
        new = [h for h, has in zip(hashes, present, strict=True) if not has]
        if self.observer is not None and new:
            self.observer.stored(tier.name, ns, new)

    def _write_missing(
        self,
        tier: Tier,
        ns: Namespace,
        items: list[tuple[int, torch.Tensor]],
        encoded: dict[int, bytes] | None = None,
    ) -> dict[int, bytes]:
        """Encodes (or reuses `encoded`) and writes the items `tier` lacks; returns the encodings."""
        encoded = {} if encoded is None else encoded
        present = tier.contains(ns, [h for h, _ in items])
        missing = [(h, kv) for (h, kv), has in zip(items, present, strict=True) if not has]
        fmt = stored_format(ns.kv_dtype)  # a packed format's blocks are tagged as such
        for h, kv in missing:
            if h not in encoded:
                encoded[h] = encode_block(kv, fmt)
        self._put(tier, ns, [(h, encoded[h]) for h, _ in missing])
        return encoded
