"""What a tier hit costs at the default model's block size (30 layers, 3 KV heads, head_dim 64,
bf16, 16 tokens: bytes_per_block), per block: blocks of random KV spilled into one tier through a
TieredStore (writer thread: encode, then host RAM or a file), then loaded back through its loader
thread (host: the stored bytes; disk: file read and xxh64 check; both: header check and decode)
and copied into a paged pool of the model's shape, as KVTiers installs them. Disk twice: from the
page cache (files just written) and with the page cache dropped (fsync + POSIX_FADV_DONTNEED per
file first; what the disk's own cache below the OS keeps is not dropped)."""

from __future__ import annotations

import os
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.kv.paged_cache import KVCache, bytes_per_block
from radixcache.hashing import Namespace, block_hashes
from storage.config import TierConfig
from storage.disk import DiskTier
from storage.tiered import TieredStore

BS = 16
MODEL_LAYERS, MODEL_KV_HEADS, MODEL_HEAD_DIM = 30, 3, 64  # the default model, SmolLM2-135M
NS = Namespace("load-cost", "bfloat16", BS)


def model_block_bytes() -> int:
    """One 16-token block of the default model's KV in bf16."""
    return bytes_per_block(MODEL_LAYERS, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM, torch.bfloat16)


@dataclass(frozen=True)
class LoadCost:
    tier: str  # host, disk, disk-cold
    blocks: int
    block_bytes: int
    spill_us: float  # per block: store() until the writer is idle (copy, encode, write)
    load_us: float  # per block: the load plus the copy into the pool, median of the reps
    load_us_min: float  # the fastest rep (the machine may be shared)


def model_pool(num_blocks: int, seed: int) -> KVCache:
    kv = KVCache(MODEL_LAYERS, num_blocks, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM, torch.bfloat16)
    kv.tensor.normal_(generator=torch.Generator().manual_seed(seed))
    return kv


def drop_page_cache(disk: DiskTier, hashes: list[int]) -> None:
    for h in hashes:
        fd = os.open(disk.path_of(NS, h), os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def load_once(store: TieredStore, hashes: list[int], pool: KVCache) -> float:
    """Seconds to load `hashes` and copy them into the pool's first blocks."""
    shape = (MODEL_LAYERS, 2, BS, MODEL_KV_HEADS, MODEL_HEAD_DIM)
    t0 = time.perf_counter()
    loaded = store.load_prefix(NS, hashes, shape=shape)
    pool.write_blocks(range(len(loaded.blocks)), loaded.blocks)
    seconds = time.perf_counter() - t0
    if len(loaded.blocks) != len(hashes):
        raise RuntimeError(f"loaded {len(loaded.blocks)} of {len(hashes)} blocks")
    return seconds


def measure_tier(kind: str, root: Path, blocks: int, reps: int) -> list[LoadCost]:
    src, dst = model_pool(blocks, seed=1), model_pool(blocks, seed=2)
    tokens = [random.Random(3).randrange(100, 49000) for _ in range(blocks * BS)]
    hashes = block_hashes(NS, tokens)
    if kind == "host":
        config = TierConfig(host_bytes=4 * blocks * model_block_bytes(), deadline_s=60.0)
    else:
        config = TierConfig(disk_path=root / "disk", deadline_s=60.0)
    store = TieredStore(config)
    try:
        t0 = time.perf_counter()
        store.store(NS, [(h, src.tensor[:, :, i]) for i, h in enumerate(hashes)])
        store.wait_idle()
        spill_us = (time.perf_counter() - t0) / blocks * 1e6
        variants = ["host"] if kind == "host" else ["disk", "disk-cold"]
        out = []
        for name in variants:
            times = []
            for _ in range(reps):
                if name == "disk-cold":
                    drop_page_cache(store.tiers[0], hashes)  # type: ignore[arg-type]
                times.append(load_once(store, hashes, dst))
            if not torch.equal(src.tensor, dst.tensor):
                raise RuntimeError(f"{name}: the loaded KV differs from what was spilled")
            dst.tensor.zero_()
            us = [t / blocks * 1e6 for t in times]
            cost = LoadCost(
                name, blocks, model_block_bytes(), spill_us, statistics.median(us), min(us)
            )
            out.append(cost)
        return out
    finally:
        store.close()


def measure(root: Path, blocks: int, reps: int, threads: int) -> list[LoadCost]:
    """Per-block spill and load costs of the host and disk tiers at the model's block size, with
    `threads` torch threads (each block's copy is a parallel region of its own: with two threads
    on a shared two-core machine, each one waits out a scheduler slice at the OpenMP barrier
    whenever another process holds the other core)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [c for k in ("host", "disk") for c in measure_tier(k, root / k, blocks, reps)]
    finally:
        torch.set_num_threads(before)
