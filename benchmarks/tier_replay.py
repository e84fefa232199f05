"""The Mooncake trace through the engine's real KV path: a KVCacheManager over a paged pool, with
KVTiers over a TieredStore (host RAM, then disk) below it, driven request by request in the order
the scheduler drives it: match; while LOADING, wait for the load and match again; allocate;
computed; free. No model runs: the "forward" writes each computed block's trace id into its KV,
so every block a hit brings back, from the device or a tier, is checked against the id it stands
for, bit for bit.

The tiers hold blocks in the --tier-kv-dtype format through KVTiers' own conversion (auto: the
pool's bf16; int8 / fp8: quantized on the way down, dequantized on the way back). So that a
lossy format still brings a block back exactly, each of its rows is the format's largest code
value, then the id's base-8 digits: the row's scale is exactly 1 and each digit is its own code
(engine/kv/quant.py), in int8 and both fp8 formats alike.

One 16-token block per trace id (bench_index.block_tokens), so the replay's blocks are the
trace's blocks and its hit rates compare with bench_policy's. The pool is tiny (1 layer, 1 KV
head, head_dim 8, bf16: 512 bytes a block): every size is in blocks, and a tier's byte budget is
its blocks times the tiny block's encoded size in the tier format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from benchmarks import bench_index as bi
from engine.kv import KVCacheManager, MatchState
from engine.kv.paged_cache import KVCache, bytes_per_block
from engine.kv.quant import KVFormat, kv_format
from engine.kv.tier_format import tier_format
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
HEAD_DIM = 8  # the tiny pool's rows: a block's row top and seven id digits
ID_BASE = 8  # digits 0..7: exact in bf16 and, at scale 1, as int8 / fp8_e4m3 / fp8_e5m2 codes
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
    held_bytes: dict[str, int] = field(default_factory=dict)  # per tier, at the end
    store_stats: StoreStats = field(default_factory=StoreStats)

    @property
    def hit_blocks(self) -> int:
        return sum(self.hits.values())

    def rate(self, level: str | None = None) -> float:
        """Hit rate of one level, or of all (blocks hit / blocks looked up)."""
        n = self.hit_blocks if level is None else self.hits[level]
        return n / self.lookups


def tiny_value_bytes(fmt: KVFormat | None = None) -> int:
    """One encoded block of the tiny pool in a tier format (None: bf16): what a tier's byte
    budget counts per block."""
    return HEADER_SIZE + bytes_per_block(1, BS, 1, HEAD_DIM, torch.bfloat16, fmt)


def row_top(fmt: KVFormat | None) -> float:
    """A row's first value: the format's largest code value, so its scale is exactly 1."""
    return 1.0 if fmt is None else fmt.qmax


def id_rows(ids: list[int], top: float) -> torch.Tensor:
    """[n, HEAD_DIM] bf16: `top`, then each trace id's base-8 digits, lowest first."""
    if ids and max(ids) >= ID_BASE ** (HEAD_DIM - 1):
        raise ValueError(f"trace id {max(ids)} has more than {HEAD_DIM - 1} base-8 digits")
    t = torch.tensor(ids, dtype=torch.int64).unsqueeze(1)
    digits = t // ID_BASE ** torch.arange(HEAD_DIM - 1) % ID_BASE
    return torch.cat((torch.full((len(ids), 1), top), digits), dim=1).to(torch.bfloat16)


def write_ids(kv: KVCache, block_ids: list[int], ids: list[int], top: float) -> None:
    """The stand-in forward: every K and V row of each block holds its trace id."""
    if block_ids:
        kv.tensor[0, :, block_ids, :, 0, :] = id_rows(ids, top).view(1, -1, 1, HEAD_DIM)


def wrong_blocks(kv: KVCache, block_ids: list[int], ids: list[int], top: float) -> int:
    """Blocks among `block_ids` with a K or V row that is not their id's."""
    if not block_ids:
        return 0
    want = id_rows(ids, top).view(1, -1, 1, HEAD_DIM)
    got = kv.tensor[0, :, block_ids, :, 0, :]  # [2, n, bs, HEAD_DIM]
    return int((got != want).any(dim=3).any(dim=2).any(dim=0).sum())


def build(sizes: Sizes, disk_dir: Path, policy: str, tier_kv_dtype: str) -> KVCacheManager:
    """The engine's KV parts as engine/factory.py wires them, at `sizes`, the tiers holding
    blocks in the `tier_kv_dtype` format."""
    value = tiny_value_bytes(kv_format(tier_kv_dtype))
    config = TierConfig(
        host_bytes=sizes.host * value,
        disk_path=disk_dir if sizes.disk else None,
        disk_bytes=max(1, sizes.disk) * value,
        deadline_s=DEADLINE_S,
        kv_dtype=tier_kv_dtype,
    )
    kv = KVCache(1, sizes.device, BS, 1, HEAD_DIM, torch.bfloat16)
    cache = PrefixCache(sizes.device, BS, policy=policy)
    fmt = tier_format(None, config.kv_dtype)
    tiers = KVTiers(TieredStore(config), kv, fmt=fmt) if config.enabled else None
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


def serve(
    manager: KVCacheManager, seq: Sequence, ids: list[int], top: float, out: ReplayResult
) -> None:
    """One request: admit it, count and check its hits, compute the rest, finish it."""
    count(out, seq, admit(manager, seq))
    hit = -(-seq.num_computed_tokens // BS)
    out.wrong_blocks += wrong_blocks(manager.kv_cache, seq.block_ids[:hit], ids[:hit], top)
    new = seq.num_tokens - seq.num_computed_tokens
    if not manager.allocate(seq, new):
        raise RuntimeError(f"a {len(ids)}-block request does not fit {manager.num_blocks} blocks")
    first = seq.num_computed_tokens // BS  # [first, n): private blocks this step writes
    write_ids(manager.kv_cache, seq.block_ids[first:], ids[first:], top)
    manager.computed(seq, new)
    manager.free(seq)


def sequence(r: int, ids: list[int], table: dict[int, list[int]]) -> Sequence:
    tokens = bi.trace_tokens(ids, BS, table)
    request = Request(f"r{r}", None, tokens, SamplingParams(max_tokens=1), NS)
    seq = Sequence(request, 0, token_array(tokens), len(tokens), None, detok=None)  # type: ignore[arg-type]
    request.seqs.append(seq)
    return seq


def replay_tiers(
    trace: list[list[int]],
    sizes: Sizes,
    disk_dir: Path,
    policy: str = "lru",
    tier_kv_dtype: str = "auto",
) -> ReplayResult:
    """Serves every request of `trace` in order, then checks the cache's invariants (raises
    IntegrityError) and counts the blocks still referenced. The tiers' writes finish after each
    request (a prefill of its length would give the writer that time)."""
    top = row_top(kv_format(tier_kv_dtype))
    manager = build(sizes, disk_dir, policy, tier_kv_dtype)
    store = None if manager.tiers is None else manager.tiers.store
    out, table = ReplayResult(), {}
    t0 = time.perf_counter()
    try:
        for r, ids in enumerate(trace):
            serve(manager, sequence(r, ids, table), ids, top, out)
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
            out.held_bytes = {name: t.used_bytes for name, t in snap.tiers.items()}
            out.store_stats = snap.store
    finally:
        manager.close()
    return out
