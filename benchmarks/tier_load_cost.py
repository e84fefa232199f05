"""What a tier hit costs at the default model's block size (30 layers, 3 KV heads, head_dim 64,
bf16, 16 tokens: bytes_per_block), per block: blocks of random KV spilled into one tier through a
TieredStore (writer thread: encode, then host RAM or a file), then loaded back through its loader
thread (host: the stored bytes; disk: file read and xxh64 check; both: header check and decode)
and copied into a paged pool of the model's shape, as KVTiers installs them. Disk twice: from the
page cache (files just written) and with the page cache dropped (fsync + POSIX_FADV_DONTNEED per
file first; what the disk's own cache below the OS keeps is not dropped).

Per tier format (--tier-kv-dtype, engine/kv/tier_format.py): auto stores the pool's bf16 blocks;
int8 / fp8 quantize each block on its way down (in the spill time) and dequantize it into the
bf16 pool on its way back (in the load time), as KVTiers does."""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kv.paged_cache import KVCache, bytes_per_block
from engine.kv.quant import KVFormat, kv_format
from engine.kv.tier_format import TierFormat, tier_format
from radixcache.hashing import Namespace, block_hashes
from storage.codec import HEADER_SIZE, stored_format
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.tiered import TieredStore

BS = 16
MODEL_LAYERS, MODEL_KV_HEADS, MODEL_HEAD_DIM = 30, 3, 64  # the default model, SmolLM2-135M
NS = Namespace("load-cost", "bfloat16", BS)


def model_block_bytes(fmt: KVFormat | None = None) -> int:
    """One 16-token block of the default model's KV in bf16 (fmt: its quantized rows)."""
    return bytes_per_block(MODEL_LAYERS, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM, torch.bfloat16, fmt)


def model_value_bytes(fmt: KVFormat | None = None) -> int:
    """The codec's encoding of such a block: what a tier's byte budget counts per block."""
    return HEADER_SIZE + model_block_bytes(fmt)


@dataclass(frozen=True)
class LoadCost:
    tier: str  # host, disk, disk-cold
    format: str  # what the tier holds: bfloat16, int8, fp8_e4m3, fp8_e5m2
    blocks: int
    block_bytes: int  # a stored block's payload
    value_bytes: int  # with the codec's header: what the tier holds per block
    spill_us: float  # per block: store() until the writer is idle (copy, encode, write)
    load_us: float  # per block: the load plus the copy into the pool, median of the reps
    load_us_min: float  # the fastest rep (the machine may be shared)


def model_pool(num_blocks: int, seed: int) -> KVCache:
    kv = KVCache(MODEL_LAYERS, num_blocks, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM, torch.bfloat16)
    kv.tensor.normal_(generator=torch.Generator().manual_seed(seed))
    return kv


def drop_page_cache(disk: DiskTier, fmt: TierFormat, hashes: list[int]) -> None:
    for h in hashes:
        fd = os.open(disk.path_of(fmt.namespace(NS), h), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def spill(store: TieredStore, fmt: TierFormat, hashes: list[int], pool: KVCache) -> float:
    """Seconds to convert the pool's blocks to the tier format, queue them and write them."""
    t0 = time.perf_counter()
    items = [(h, fmt.down(pool.tensor[:, :, i])) for i, h in enumerate(hashes)]
    store.store(fmt.namespace(NS), items)
    store.wait_idle()
    return time.perf_counter() - t0


def load_once(store: TieredStore, fmt: TierFormat, hashes: list[int], pool: KVCache) -> float:
    """Seconds to load `hashes`, convert them to the pool's dtype and copy them into its first
    blocks."""
    shape = fmt.block_shape((MODEL_LAYERS, 2, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM))
    t0 = time.perf_counter()
    loaded = store.load_prefix(fmt.namespace(NS), hashes, shape=shape)
    blocks = [fmt.up(kv, pool.tensor) for kv in loaded.blocks]
    pool.write_blocks(range(len(blocks)), blocks)
    seconds = time.perf_counter() - t0
    if len(loaded.blocks) != len(hashes):
        raise RuntimeError(f"loaded {len(loaded.blocks)} of {len(hashes)} blocks")
    return seconds


def measure_tier(
    kind: str, root: Path, blocks: int, reps: int, tier_kv_dtype: str
) -> list[LoadCost]:
    fmt, qfmt = tier_format(None, tier_kv_dtype), kv_format(tier_kv_dtype)
    name = stored_format(fmt.namespace(NS).kv_dtype)
    src, dst = model_pool(blocks, seed=1), model_pool(blocks, seed=2)
    want = fmt.up(fmt.down(src.tensor), dst.tensor)  # what a load must bring back, exactly
    tokens = [random.Random(3).randrange(100, 49000) for _ in range(blocks * BS)]
    hashes = block_hashes(NS, tokens)
    if kind == "host":
        config = TierConfig(host_bytes=4 * blocks * model_block_bytes(), deadline_s=60.0)
    else:
        config = TierConfig(disk_path=root / "disk", deadline_s=60.0)
    store = TieredStore(config)
    try:
        spill_us = spill(store, fmt, hashes, src) / blocks * 1e6
        variants = ["host"] if kind == "host" else ["disk", "disk-cold"]
        out = []
        for variant in variants:
            times = []
            for _ in range(reps):
                if variant == "disk-cold":
                    drop_page_cache(store.tiers[0], fmt, hashes)  # type: ignore[arg-type]
                times.append(load_once(store, fmt, hashes, dst))
            if not torch.equal(want, dst.tensor):
                raise RuntimeError(f"{variant} {name}: the loaded KV differs from what was spilled")
            dst.tensor.zero_()
            us = [t / blocks * 1e6 for t in times]
            bytes_ = model_block_bytes(qfmt), model_value_bytes(qfmt)
            median = statistics.median(us)
            out.append(LoadCost(variant, name, blocks, *bytes_, spill_us, median, min(us)))
        return out
    finally:
        store.close()


def measure(
    root: Path, blocks: int, reps: int, threads: int, formats: tuple[str, ...] = ("auto",)
) -> list[LoadCost]:
    """Per-block spill and load costs of the host and disk tiers at the model's block size, in
    each tier format of `formats` (--tier-kv-dtype names), with `threads` torch threads (each
    block's copy is a parallel region of its own: with two threads on a shared two-core machine,
    each one waits out a scheduler slice at the OpenMP barrier whenever another process holds
    the other core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [
            cost
            for name in formats
            for kind in ("host", "disk")
            for cost in measure_tier(kind, root / name / kind, blocks, reps, name)
        ]
    finally:
        torch.set_num_threads(before)
