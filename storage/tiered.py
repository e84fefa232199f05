"""TieredStore: the spill tiers below device memory, chained host -> disk -> Redis.

The engine calls two things, both cheap on its own thread:
  store(ns, [(hash, kv)])            on device eviction: copies the KV, queues it, returns
  load_prefix(ns, hashes, deadline)  at admission: the longest leading run of `hashes` found in
                                     the tiers, waiting at most `deadline` seconds
Writes run on one writer thread behind a bounded queue (overflow is dropped and counted); loads run
on one loader thread, so a slow tier costs the engine at most the deadline, then it recomputes.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from storage.base import Tier
from storage.codec import CorruptBlock, decode_block, encode_block
from storage.config import TierConfig
from storage.loading import LoadJob, leading_run, segments

if TYPE_CHECKING:
    from radixcache.hashing import Namespace

__all__ = ["LoadResult", "StoreStats", "TierConfig", "TieredStore"]

# (kind, target tier, ns, items): "new" = evicted tensors for the top tier (and Redis when
# write-through), "publish" = computed tensors for Redis, "put" = encoded values for `target`
_Job = tuple[str, Tier | None, "Namespace", list]


class LoadResult(NamedTuple):
    tiers: list[str]  # tier name per loaded block, in order
    blocks: list[torch.Tensor]  # [layers, 2, block_size, kv_heads, head_dim] each (read-only)


@dataclass
class StoreStats:
    stored_blocks: int = 0  # blocks handed to store() and queued
    dropped_blocks: int = 0  # blocks refused because the writer queue was full
    loads: int = 0  # load_prefix calls that asked the tiers
    loaded_blocks: int = 0
    deadline_misses: int = 0  # load_prefix calls that returned at the deadline
    load_errors: int = 0  # load_prefix calls cut short by an unexpected tier exception


class TieredStore:
    def __init__(self, config: TierConfig, tiers: list[Tier] | None = None) -> None:
        self.config = config
        self.tiers: list[Tier] = config.build_tiers() if tiers is None else tiers
        self.store_stats = StoreStats()
        for i, tier in enumerate(self.tiers):
            target = self._spill_target(i)
            tier.on_evict = None if target is None else self._spiller(target)
        self._redis = next((t for t in self.tiers if t.name == "redis"), None)
        self._pending = 0  # blocks queued for the writer
        self._pending_lock = threading.Lock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._writer = threading.Thread(target=self._write_loop, name="tier-writer", daemon=True)
        self._writer.start()
        self._loader = ThreadPoolExecutor(1, thread_name_prefix="tier-loader")

    # --- engine-facing API ---
    def store(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        """Queue evicted blocks for the tiers. Copies each KV tensor (any device, may be a view
        of the pool) before returning, so the caller may reuse the device block at once."""
        self._enqueue("new", None, ns, items)

    @property
    def write_through(self) -> bool:
        """True when computed blocks should be published to Redis at once (see publish)."""
        return self.config.write_policy == "write-through" and self._redis is not None

    def publish(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        """Write-through: queue freshly computed blocks (still on device) for Redis only, so other
        replicas can load them. Copies like store(); a no-op unless write_through."""
        if self.write_through:
            self._enqueue("publish", self._redis, ns, items)

    def load_prefix(
        self,
        ns: Namespace,
        hashes: list[int],
        deadline_s: float | None = None,
        *,
        shape: tuple[int, ...] | None = None,
    ) -> LoadResult:
        """The longest run of leading `hashes` found across the tiers (each block from the fastest
        tier holding it), decoded and checked against ns.kv_dtype (and `shape` if given). Returns
        what was loaded when the deadline passes. Disk/Redis hits are promoted into the top tier."""
        if not hashes or not self.tiers:
            return LoadResult([], [])
        job = LoadJob(ns, list(hashes), shape)
        future = self._loader.submit(self._load, job)
        self.store_stats.loads += 1
        try:
            future.result(timeout=self.config.deadline_s if deadline_s is None else deadline_s)
        except FutureTimeout:
            self.store_stats.deadline_misses += 1
        except Exception:  # a failing tier must not fail the request: recompute instead
            self.store_stats.load_errors += 1
        names, blocks = job.finish()
        self._count_hits(ns, names)
        return LoadResult(names, blocks)

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

    def stats(self) -> dict[str, dict[str, float]]:
        """Snapshot: one dict of counters per tier name, plus "store"."""
        out = {tier.name: tier.stats.snapshot() for tier in self.tiers}
        for tier in self.tiers:
            out[tier.name]["used_bytes"] = tier.used_bytes()
        out["store"] = asdict(self.store_stats) | {"pending_blocks": self._pending}
        return out

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until every queued write is done (tests, shutdown). False on timeout."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._queue.all_tasks_done:
            while self._queue.unfinished_tasks:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._queue.all_tasks_done.wait(left)
        return True

    def close(self, timeout: float = 10.0) -> None:
        self.wait_idle(timeout)
        self._queue.put(None)
        self._writer.join(timeout)
        self._loader.shutdown(wait=False, cancel_futures=True)
        for tier in self.tiers:
            tier.close()

    # --- writer thread ---
    def _write_loop(self) -> None:
        while (job := self._queue.get()) is not None:
            kind, target, ns, items = job
            try:
                if kind == "new":
                    self._write_new(ns, items)
                elif kind == "publish":
                    self._write_missing(target, ns, items)
                else:
                    target.put(ns, items)
            except Exception:  # a tier bug must not kill the writer; the tier counts its errors
                (target or self.tiers[0]).stats.errors += 1
            finally:
                with self._pending_lock:
                    self._pending -= len(items)
                self._queue.task_done()
        self._queue.task_done()

    def _write_new(self, ns: Namespace, items: list[tuple[int, torch.Tensor]]) -> None:
        encoded = self._write_missing(self.tiers[0], ns, items)
        if self.write_through and self._redis is not self.tiers[0]:
            self._write_missing(self._redis, ns, items, encoded)

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
        for h, kv in missing:
            if h not in encoded:
                encoded[h] = encode_block(kv)
        tier.put(ns, [(h, encoded[h]) for h, _ in missing])
        return encoded

    def _spill_target(self, i: int) -> Tier | None:
        if i + 1 >= len(self.tiers):
            return None
        nxt = self.tiers[i + 1]
        if self.config.write_policy == "write-through" and nxt.name == "redis":
            return None  # Redis already has every block
        return nxt

    def _spiller(self, target: Tier):
        def spill(ns: Namespace, items: list[tuple[int, bytes]]) -> None:
            if threading.current_thread() is self._writer:
                target.put(ns, items)
            else:
                self._submit(target, ns, items)

        return spill

    def _submit(self, target: Tier, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        if self._reserve(len(items)):
            self._queue.put(("put", target, ns, items))
        else:
            self.store_stats.dropped_blocks += len(items)

    def _enqueue(
        self, kind: str, target: Tier | None, ns: Namespace, items: list[tuple[int, torch.Tensor]]
    ) -> None:
        if not items or not self.tiers:
            return
        if not self._reserve(len(items)):
            self.store_stats.dropped_blocks += len(items)
            return
        snapshots = [(h, torch.empty(kv.shape, dtype=kv.dtype).copy_(kv)) for h, kv in items]
        self.store_stats.stored_blocks += len(items)
        self._queue.put((kind, target, ns, snapshots))

    def _reserve(self, n: int) -> bool:
        with self._pending_lock:
            if self._pending + n > self.config.queue_blocks:
                return False
            self._pending += n
            return True

    # --- loader thread ---
    def _load(self, job: LoadJob) -> None:
        where = leading_run(self.tiers, job.ns, job.hashes, count_misses=True)
        promote = []
        for t, start, end in segments(where):
            if job.cancelled:
                break
            tier, hashes = self.tiers[t], job.hashes[start:end]
            t0 = time.perf_counter()
            values = tier.get(job.ns, hashes)
            tier.stats.load_time_s += time.perf_counter() - t0
            for h, value in zip(hashes, values, strict=True):
                block = self._decode(tier, job, h, value)
                if block is None or not job.add(tier.name, block):
                    return self._promote(job.ns, promote)
                if t > 0:
                    promote.append((h, value))
        self._promote(job.ns, promote)

    def _decode(self, tier: Tier, job: LoadJob, h: int, value: bytes | None) -> torch.Tensor | None:
        if value is None:
            return None
        try:
            return decode_block(value, job.ns.kv_dtype, job.shape, verify=False)
        except CorruptBlock:
            tier.stats.corrupt += 1
            tier.delete(job.ns, [h])
            return None

    def _promote(self, ns: Namespace, items: list[tuple[int, bytes]]) -> None:
        if items:
            self._submit(self.tiers[0], ns, items)

    def _count_hits(self, ns: Namespace, names: list[str]) -> None:
        self.store_stats.loaded_blocks += len(names)
        by_name = {tier.name: tier for tier in self.tiers}
        for name in names:
            by_name[name].stats.hits += 1
            by_name[name].stats.hit_tokens += ns.block_size
