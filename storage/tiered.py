"""TieredStore: the spill tiers below device memory, chained host -> disk -> Redis.

The engine calls these, all cheap on its own thread:
  store(ns, [(hash, kv)])         on device eviction: copies the KV, queues it, returns
  retain(ns, [(hash, kv)])        a prefix to keep in the persistent tier (disk, else Redis) past
                                  its ordinary eviction, for a while (storage/retention.py)
  start_load(ns, hashes, shape)   at admission: starts loading the longest leading run of
                                  `hashes` found in the tiers and returns a PendingLoad at once;
                                  the engine keeps stepping and takes the blocks when it is done
                                  (or when its deadline passes, then it recomputes the rest)
Writes run on one writer thread (storage.writer) behind a bounded queue (overflow is dropped and
counted); loads run on one loader thread, paced by the engine's steps while it decodes
(storage.pacing: step_started). load_prefix is the blocking form (tests, tools).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NamedTuple, cast

import torch

from radixcache.shared.tier_names import TierName
from storage.base import RetainingTier, Tier
from storage.codec import CorruptBlock, decode_block, stored_format
from storage.config import TierConfig
from storage.loading import LoadJob, leading_run, segments
from storage.pacing import LoadPacer
from storage.pinned_host import PinnedHostTier
from storage.store_stats import StoreSnapshot, StoreStats, TierSnapshot
from storage.transfer import DeviceCopies
from storage.writer import TierObserver, TierWriter

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

__all__ = ["LoadResult", "PendingLoad", "TierConfig", "TieredStore"]


class LoadResult(NamedTuple):
    tiers: list[str]  # tier name per loaded block, in order
    blocks: list[torch.Tensor]  # [layers, 2, block_size, kv_heads, head_dim] each (read-only)


class PendingLoad:
    """A load on the loader thread. The engine polls `ready` (done or past its deadline), then
    `take`s what arrived; taking it earlier cancels the rest (a deadline miss)."""

    def __init__(self, store: TieredStore, job: LoadJob, future: Future | None) -> None:
        self.deadline = job.deadline  # time.monotonic() after which the engine stops waiting
        self._store, self._job, self._future = store, job, future

    def done(self) -> bool:
        return self._future is None or self._future.done()

    def ready(self, now: float) -> bool:
        return now >= self.deadline or self.done()

    def wait(self, timeout: float) -> bool:
        """Blocks until the load is done, at most `timeout` seconds; True when done."""
        if self._future is None:
            return True
        try:
            self._future.result(timeout=timeout)
        except FutureTimeout:
            return False
        except Exception:  # counted in take()
            pass
        return True

    def take(self) -> LoadResult:
        """Stops the loader (if still running) and returns the blocks loaded so far."""
        stats = self._store.store_stats
        if self._future is not None:
            if not self._future.done():
                stats.deadline_misses += 1
            elif self._future.exception() is not None:
                stats.load_errors += 1  # a failing tier must not fail the request: recompute
        names, blocks = self._job.finish()
        self._store._count_hits(self._job.ns, names)
        return LoadResult(names, blocks)

    def cancel(self) -> None:
        """The sequence went away: drop whatever was loaded, count nothing."""
        self._job.finish()


class TieredStore:
    def __init__(
        self,
        config: TierConfig,
        tiers: list[Tier] | None = None,
        observer: TierObserver | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        """`observer` is told of every block a tier gains or loses (writes, budget evictions,
        corrupt values dropped); Redis expiry (TTL, maxmemory) is not observable from here.
        `device`: the KV pool's; loads arrive there, copied off the engine's stream
        (storage.transfer), and a GPU pool's host tier is pinned (storage.pinned_host)."""
        self.config = config
        self.copies = DeviceCopies(device)
        self.tiers: list[Tier] = config.build_tiers(self.copies.device) if tiers is None else tiers
        self.store_stats = StoreStats()
        self.observer = observer
        self._redis = next((t for t in self.tiers if t.name == TierName.REDIS), None)
        # where retained prefixes go: the disk tier, else Redis (both are RetainingTiers)
        persistent = [t for t in self.tiers if t.name in (TierName.DISK, TierName.REDIS)]
        self._keeper = cast("RetainingTier", persistent[0]) if persistent else None
        self._writer = TierWriter(
            self.tiers,
            self.write_through,
            config.queue_blocks,
            self.store_stats,
            observer,
            self.copies,
        )
        for i, tier in enumerate(self.tiers):
            target = self._spill_target(i)
            if observer is not None:
                tier.spill_down = partial(self._evicted, tier, target)
            else:
                tier.spill_down = None if target is None else partial(self._writer.put, target)
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="tier-loader")
        self.pacer = LoadPacer()

    # --- engine-facing API ---
    def store(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        """Queue evicted blocks for the tiers. Copies each KV tensor (any device, may be a view
        of the pool) before returning, so the caller may reuse the device block at once."""
        if self.tiers:
            self._writer.enqueue_tensors("new", None, ns, items)

    @property
    def write_through(self) -> bool:
        """True when computed blocks should be published to Redis at once (see publish)."""
        return self.config.write_policy == "write-through" and self._redis is not None

    def publish(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        """Write-through: queue freshly computed blocks (still on device) for Redis only, so other
        replicas can load them. Copies like store(); a no-op unless write_through."""
        if self.write_through:
            self._writer.enqueue_tensors("publish", self._redis, ns, items)

    @property
    def can_retain(self) -> bool:
        """Whether there is a persistent tier to keep retained prefixes in, with a budget."""
        return self._keeper is not None and self.config.retained_bytes > 0

    def retain(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        """Queues a prefix's blocks (in prefix order; still on device: copied like store()) for
        the persistent tier, retained there. A no-op without one."""
        if self._keeper is not None:
            self._writer.enqueue_tensors("retain", self._keeper, ns, items)

    def start_load(
        self,
        ns: Namespace,
        hashes: list[int],
        deadline_s: float | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> PendingLoad:
        """Starts loading the longest run of leading `hashes` found across the tiers (each block
        from the fastest tier holding it), decoded and checked against the format ns.kv_dtype
        names (codec.stored_format; and `shape` if given); returns at once. Disk/Redis hits are
        promoted into the top tier."""
        deadline = time.monotonic() + (self.config.deadline_s if deadline_s is None else deadline_s)
        job = LoadJob(ns, list(hashes), shape, deadline)
        if not hashes or not self.tiers:
            return PendingLoad(self, job, None)
        self.store_stats.loads += 1
        self.pacer.job_started()
        return PendingLoad(self, job, self._loader.submit(self._load, job))

    def step_started(self, decoding: bool) -> None:
        """The engine starts a step (`decoding`: it has running sequences): paces the loader."""
        self.pacer.step_started(decoding)

    def load_prefix(
        self,
        ns: Namespace,
        hashes: list[int],
        deadline_s: float | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> LoadResult:
        """start_load, waiting for it up to the deadline: what was loaded by then."""
        pending = self.start_load(ns, hashes, deadline_s, shape=shape)
        pending.wait(max(0.0, pending.deadline - time.monotonic()))
        return pending.take()

    def locate(self, ns: Namespace, hashes: list[int]) -> list[str]:
        """Tier name for each block of the leading run found (no data is read)."""
        where = leading_run(self.tiers, ns, hashes, count_misses=False)
        return [self.tiers[t].name for t in where]

    def lookup_tokens(self, ns: Namespace, hashes: list[int]) -> dict[str, int]:
        """Tokens of the leading run per tier, e.g. {"host": 32, "disk": 16, "redis": 0}."""
        out = {tier.name: 0 for tier in self.tiers}
        for name in self.locate(ns, hashes):
            out[name] += ns.block_size
        return out

    def stats(self) -> StoreSnapshot:
        budgets = {TierName.HOST: self.config.host_bytes, TierName.DISK: self.config.disk_bytes}
        tiers = {
            t.name: TierSnapshot(replace(t.stats), t.used_bytes(), budgets.get(t.name))
            for t in self.tiers
        }
        keeper = self._keeper
        retention = None if keeper is None else (keeper.name, keeper.retention_stats())
        return StoreSnapshot(tiers, replace(self.store_stats), self._writer.pending, retention)

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued write is done (tests, shutdown). False on timeout."""
        return self._writer.wait_idle(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Finish queued writes (up to `timeout`), stop the threads, close the tiers."""
        self._writer.close(timeout)
        self.pacer.step_started(decoding=False)  # no more steps: a paced load may finish
        self._loader.shutdown(wait=False, cancel_futures=True)
        for tier in self.tiers:
            tier.close()

    def _evicted(self, tier: Tier, target: Tier | None, ns: Namespace, items: list) -> None:
        """A tier dropped `items` to stay within its budget: report them, spill them lower."""
        assert self.observer is not None
        self.observer.removed(tier.name, ns, [h for h, _ in items])
        if target is not None:
            self._writer.put(target, ns, items)

    def _spill_target(self, i: int) -> Tier | None:
        if i + 1 >= len(self.tiers):
            return None
        nxt = self.tiers[i + 1]
        if self.write_through and nxt is self._redis:
            return None  # Redis already has every block
        return nxt

    # --- loader thread ---
    def _load(self, job: LoadJob) -> None:
        try:
            if not job.cancelled:  # a load whose deadline passed in the queue reads nothing
                self._read(job)
        finally:
            self.pacer.job_finished()

    def _read(self, job: LoadJob) -> None:
        where = leading_run(self.tiers, job.ns, job.hashes, count_misses=True)
        promote, spent = [], 0.0
        parts = list(segments(where, self.pacer.segment_blocks))
        for n, (t, start, end) in enumerate(parts):
            self.pacer.wait_turn(spent, job.deadline, len(parts) - n)
            if job.cancelled:
                break
            tier, hashes = self.tiers[t], job.hashes[start:end]
            t0 = time.perf_counter()
            values, blocks = self._fetch(tier, job, hashes)
            tier.stats.load_time_s += time.perf_counter() - t0
            for h, value, block in zip(hashes, values, blocks, strict=True):
                if block is None or not job.add(tier.name, block):
                    return self._promote(job.ns, promote)
                if t > 0:
                    promote.append((h, value))
            spent = time.perf_counter() - t0
        self._promote(job.ns, promote)

    def _fetch(
        self, tier: Tier, job: LoadJob, hashes: list[int]
    ) -> tuple[list[bytes | None], list[torch.Tensor | None]]:
        """The stored values (to promote; None from the pinned tier, the top one) and the blocks
        on the pool's device, up to the first one missing or corrupt."""
        fmt = stored_format(job.ns.kv_dtype)
        if isinstance(tier, PinnedHostTier):
            blocks = tier.copy_out(
                job.ns,
                hashes,
                fmt,
                job.shape,
                self.copies.copy_to_device,
                partial(self._dropped, tier, job.ns),
            )
            return [None] * len(hashes), blocks
        values = tier.get(job.ns, hashes)
        decoded = []
        for h, value in zip(hashes, values, strict=True):
            block = self._decode(tier, job, h, value, fmt)
            if block is None:
                break
            decoded.append(block)
        blocks: list[torch.Tensor | None] = list(self.copies.to_device(decoded))
        return values, blocks + [None] * (len(hashes) - len(blocks))

    def _decode(
        self, tier: Tier, job: LoadJob, h: int, value: bytes | None, fmt: str
    ) -> torch.Tensor | None:
        if value is None:
            return None
        try:
            return decode_block(value, fmt, job.shape, verify=False)
        except CorruptBlock:
            tier.stats.corrupt += 1
            tier.delete(job.ns, [h])
            self._dropped(tier, job.ns, [h])
            return None

    def _dropped(self, tier: Tier, ns: Namespace, hashes: list[int]) -> None:
        """Corrupt values a tier dropped while loading: gone from it, as the observer hears."""
        if self.observer is not None:
            self.observer.removed(tier.name, ns, hashes)

    def _promote(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        if items:
            self._writer.put(self.tiers[0], ns, items)

    def _count_hits(self, ns: Namespace, names: list[str]) -> None:
        self.store_stats.loaded_blocks += len(names)
        by_name = {tier.name: tier for tier in self.tiers}
        for name in names:
            by_name[name].stats.hits += 1
            by_name[name].stats.hit_tokens += ns.block_size
