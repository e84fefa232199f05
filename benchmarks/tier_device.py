"""bench_tiers' `device` section: host-tier spills and loads between the KV pool's device and host
memory, through the TieredStore as the engine drives it, for both host tiers (bytes, and slots of
one arena: pinned when the pool is on a GPU). No Redis, no model: blocks of the default model's
shape, filled with random values.

Per row:
  spill: store() of every block (the engine thread's cost, per block), then until the writer
         has put them all in the tier: GB/s of the blocks' bytes over the whole;
  load:  load_prefix of the run (loader thread, blocks arriving on the device), GB/s;
  install: the engine thread's copy of the loaded blocks into the pool (KVCache.write_blocks);
  raw:   one copy of the same bytes host -> device in a single tensor (pinned on a GPU), the
         link's ceiling for the load column.
"""

from __future__ import annotations

import statistics
import time

import torch

from engine.kv.paged_cache import KVCache
from radixcache.hashing import Namespace, block_hashes
from storage import TierConfig, TieredStore
from storage.host import HostTier
from storage.pinned_host import PinnedHostTier

# SmolLM2-135M: 30 layers, 3 KV heads, head_dim 64, bfloat16, 16-token blocks
LAYERS, KV_HEADS, HEAD_DIM, BLOCK_SIZE = 30, 3, 64, 16


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _raw_gbps(nbytes: int, device: torch.device, repeats: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=True)
        _sync(device)
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times[1:]) / 1e9


def _one_round(
    kind: str, device: torch.device, pool: KVCache, num_blocks: int, seed: int
) -> dict[str, float]:
    block_bytes = pool.nbytes // pool.num_blocks
    ns = Namespace(model_id=f"bench-{seed}", kv_dtype="bfloat16", block_size=BLOCK_SIZE)
    hashes = block_hashes(ns, list(range(num_blocks * BLOCK_SIZE)))
    budget = 2 * num_blocks * (block_bytes + 4096)
    config = TierConfig(host_bytes=budget)
    host = (
        HostTier(budget) if kind == "bytes" else PinnedHostTier(budget, pin=device.type == "cuda")
    )
    store = TieredStore(config, tiers=[host], device=device)
    try:
        ids = list(range(num_blocks))
        items = [(h, pool.tensor[:, :, f]) for h, f in zip(hashes, ids, strict=True)]
        _sync(device)
        t0 = time.perf_counter()
        store.store(ns, items)
        queued = time.perf_counter() - t0
        assert store.wait_idle(120)
        spilled = time.perf_counter() - t0
        shape = tuple(pool.tensor[:, :, 0].shape)
        t0 = time.perf_counter()
        loaded = store.load_prefix(ns, hashes, deadline_s=120, shape=shape)
        load_s = time.perf_counter() - t0
        assert len(loaded.blocks) == num_blocks, "a block did not come back"
        t0 = time.perf_counter()
        pool.write_blocks(ids[::-1], loaded.blocks)  # in other blocks than they came from
        _sync(device)
        install_s = time.perf_counter() - t0
        total = num_blocks * block_bytes
        return {
            "store_us_per_block": queued / num_blocks * 1e6,
            "spill_gbps": total / spilled / 1e9,
            "load_gbps": total / load_s / 1e9,
            "install_us_per_block": install_s / num_blocks * 1e6,
        }
    finally:
        store.close()


def bench_device(device_name: str, num_blocks: int, repeats: int) -> list[dict]:
    device = torch.device(device_name)
    pool = KVCache(LAYERS, num_blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, torch.bfloat16, device)
    pool.tensor.copy_(torch.randn(pool.tensor.shape, dtype=torch.bfloat16))
    block_bytes = pool.nbytes // num_blocks
    raw = _raw_gbps(num_blocks * block_bytes, device, repeats)
    kinds = {"bytes": "host tier, bytes", "slots": "host tier, slots (pinned on a GPU)"}
    rows = []
    for kind, label in kinds.items():
        _one_round(kind, device, pool, min(num_blocks, 16), seed=99)  # warm-up
        runs = [_one_round(kind, device, pool, num_blocks, seed=r) for r in range(repeats)]
        row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
        rows.append({"tier": label, "device": str(device), "blocks": num_blocks, **row})
    rows.append({"tier": "raw copy, one tensor", "device": str(device), "load_gbps": raw})
    for row in rows:
        row["block_bytes"], row["repeats"] = block_bytes, repeats
    return rows
