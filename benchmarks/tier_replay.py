"""The Mooncake trace through the engine's real KV path: a KVCacheManager over a paged pool, with
KVTiers over a TieredStore (host RAM, then disk) below it, driven request by request in the order
the scheduler drives it: match; while LOADING, wait for the load and match again; allocate;
computed; free. No model runs: the "forward" writes each computed block's trace id into its KV
(three base-256 digits), so every block a hit brings back, from the device or a tier, is checked
against the id it stands for.

One 16-token block per trace id (bench_index.block_tokens), so the replay's blocks are the
trace's blocks and its hit rates compare with bench_policy's. The pool is tiny (1 layer, 1 KV
head, head_dim 8, bf16: 512 bytes a block): every size is in blocks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks import bench_index as bi
from engine.kv import KVCacheManager, MatchState
from engine.kv.paged_cache import KVCache
from engine.kv.tiers import KVTiers
from engine.request import Request, Sequence, token_array
from engine.sampling_params import SamplingParams
from radixcache.hashing import Namespace
from radixcache.prefix_cache import PrefixCache
from radixcache.shared.tier_names import TierName
from storage.base import TierStats
from storage.codec import HEADER_SIZE
from storage.config import TierConfig
from storage.store_stats import StoreStats
from storage.tiered import TieredStore

BS = 16
HEAD_DIM = 8  # the tiny pool's rows: room for a block's three id digits
NS = Namespace("mooncake-tiers", "bfloat16", BS)
LEVELS = (TierName.DEVICE, TierName.HOST, TierName.DISK)
# the replay measures what the tiers hold, not a deadline policy: a load may take its time (a
# shared machine can stall the loader thread); misses are still counted in store.deadline_misses
DEADLINE_S = 30.0


@dataclass(frozen=True)
class Sizes:
    """Blocks each level holds; host 0 or disk 0 switches that tier off."""

    device: int
    host: int
    disk: int


@dataclass
class Loads:
    """Requests that asked the tiers, and their time from the first match to READY (the load on
    the loader thread, then the copy into the pool): those that got blocks, those that got none."""

    found: int = 0
    found_blocks: int = 0
    found_s: float = 0.0
    empty: int = 0
    empty_s: float = 0.0


@dataclass
class ReplayResult:
    requests: int = 0
    lookups: int = 0  # blocks looked up: one per trace id of each request
    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LEVELS, 0))
    loads: Loads = field(default_factory=Loads)
    wrong_blocks: int = 0  # hit blocks whose KV is not their trace id's
    referenced_at_end: int = -1  # device blocks still referenced once every request finished
    seconds: float = 0.0
    tier_stats: dict[str, TierStats] = field(default_factory=dict)  # the store's, at the end
    store_stats: StoreStats = field(default_factory=StoreStats)

    @property
    def hit_blocks(self) -> int:
        return sum(self.hits.values())

    def rate(self, level: str | None = None) -> float:
        """Hit rate of one level, or of all (blocks hit / blocks looked up)."""
        n = self.hit_blocks if level is None else self.hits[level]
        return n / self.lookups


def tiny_value_bytes() -> int:
    """One encoded block of the tiny pool: what a tier's byte budget counts per block."""
    return HEADER_SIZE + 2 * BS * HEAD_DIM * torch.bfloat16.itemsize


def id_digits(ids: list[int]) -> torch.Tensor:
    """[n, 3] base-256 digits of trace ids (exact in bf16)."""
    t = torch.tensor(ids, dtype=torch.int64)
    return torch.stack((t % 256, t // 256 % 256, t // 65536), dim=1).to(torch.bfloat16)


def write_ids(kv: KVCache, block_ids: list[int], ids: list[int]) -> None:
    """The stand-in forward: each block's K and V rows hold its trace id's digits."""
    if block_ids:
        kv.tensor[0, :, block_ids, :, 0, :3] = id_digits(ids).view(1, -1, 1, 3)


def wrong_blocks(kv: KVCache, block_ids: list[int], ids: list[int]) -> int:
    """Blocks among `block_ids` whose KV (first row of K and of V) is not their id's."""
    if not block_ids:
        return 0
    want = id_digits(ids)
    got = kv.tensor[0, :, block_ids, 0, 0, :3]  # [2, n, 3]
    return int((got != want).any(dim=2).any(dim=0).sum())


def build(sizes: Sizes, disk_dir: Path, policy: str) -> KVCacheManager:
    """The engine's KV parts as engine/factory.py wires them, at `sizes`."""
    value = tiny_value_bytes()
    config = TierConfig(
        host_bytes=sizes.host * value,
        disk_path=disk_dir if sizes.disk else None,
        disk_bytes=max(1, sizes.disk) * value,
        deadline_s=DEADLINE_S,
    )
    kv = KVCache(1, sizes.device, BS, 1, HEAD_DIM, torch.bfloat16)
    cache = PrefixCache(sizes.device, BS, policy=policy)
    tiers = KVTiers(TieredStore(config), kv) if config.enabled else None
    listeners = () if tiers is None else (tiers,)
    return KVCacheManager(cache, kv, tiers=tiers, listeners=listeners)


def admit(manager: KVCacheManager, seq: Sequence) -> float | None:
    """match, and while its prefix loads: wait, match again (the scheduler's order). The
    seconds it loaded for; None when it did not ask the tiers."""
    manager.step_started(decoding=False)
    if manager.match(seq) is MatchState.READY:
        return None
    t0 = time.perf_counter()
    while True:
        manager.wait_for_load(seq, DEADLINE_S)
        if manager.load_ready(seq, time.monotonic()) and manager.match(seq) is MatchState.READY:
            return time.perf_counter() - t0


def count(out: ReplayResult, seq: Sequence, load_s: float | None) -> None:
    """seq's hit blocks per level (the last may lack its last token: always computed)."""
    loaded = 0
    for level, tokens in seq.cached_by_tier.items():
        blocks = -(-tokens // BS)
        out.hits[level] += blocks
        loaded += blocks if level != TierName.DEVICE else 0
    if load_s is None:
        return
    if loaded:
        out.loads.found += 1
        out.loads.found_blocks += loaded
        out.loads.found_s += load_s
    else:
        out.loads.empty += 1
        out.loads.empty_s += load_s


def serve(manager: KVCacheManager, seq: Sequence, ids: list[int], out: ReplayResult) -> None:
    """One request: admit it, count and check its hits, compute the rest, finish it."""
    count(out, seq, admit(manager, seq))
    hit = -(-seq.num_computed_tokens // BS)
    out.wrong_blocks += wrong_blocks(manager.kv_cache, seq.block_ids[:hit], ids[:hit])
    new = seq.num_tokens - seq.num_computed_tokens
    if not manager.allocate(seq, new):
        raise RuntimeError(f"a {len(ids)}-block request does not fit {manager.num_blocks} blocks")
    first = seq.num_computed_tokens // BS  # [first, n): private blocks this step writes
    write_ids(manager.kv_cache, seq.block_ids[first:], ids[first:])
    manager.computed(seq, new)
    manager.free(seq)


def sequence(r: int, ids: list[int], table: dict[int, list[int]]) -> Sequence:
    tokens = bi.trace_tokens(ids, BS, table)
    request = Request(f"r{r}", None, tokens, SamplingParams(max_tokens=1), NS)
    seq = Sequence(request, 0, token_array(tokens), len(tokens), None, detok=None)  # type: ignore[arg-type]
    request.seqs.append(seq)
    return seq


def replay_tiers(
    trace: list[list[int]], sizes: Sizes, disk_dir: Path, policy: str = "lru"
) -> ReplayResult:
    """Serves every request of `trace` in order, then checks the cache's invariants (raises
    IntegrityError) and counts the blocks still referenced. The tiers' writes finish after each
    request (a prefill of its length would give the writer that time)."""
    manager = build(sizes, disk_dir, policy)
    store = None if manager.tiers is None else manager.tiers.store
    out, table = ReplayResult(), {}
    t0 = time.perf_counter()
    try:
        for r, ids in enumerate(trace):
            serve(manager, sequence(r, ids, table), ids, out)
            out.requests += 1
            out.lookups += len(ids)
            if store is not None:
                store.wait_idle()
        out.seconds = time.perf_counter() - t0
        manager.check_integrity([])
        cache = manager.cache
        out.referenced_at_end = (
            cache.num_blocks - cache.num_free_blocks() - cache.num_evictable_blocks()
        )
        if store is not None:
            snap = store.stats()
            out.tier_stats = {name: t.stats for name, t in snap.tiers.items()}
            out.store_stats = snap.store
    finally:
        manager.close()
    return out
