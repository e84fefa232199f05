"""What a quantized KV format buys (bench_kv_quant): blocks per GiB, the hit rate a fixed memory
budget reaches on the Mooncake conversation trace, a stored block's bytes and how fast a load
installs it, and decode steps over long prefixes."""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks import bench_index as bi
from benchmarks.bench_model import BLOCK, time_step
from engine.kv.paged_cache import KVCache, bytes_per_block
from engine.kv.quant import KVFormat, quantize
from engine.kv.tier_format import tier_format
from radixcache.policy import LRUPolicy
from storage.codec import decode_block, encode_block

GIB = 1 << 30
TRACE_BLOCK = 512  # tokens per block of the Mooncake trace's hash ids


def pool_bytes_per_token(mc, dtype: torch.dtype, fmt: KVFormat | None) -> float:
    per_block = bytes_per_block(
        mc.num_hidden_layers, BLOCK, mc.num_key_value_heads, mc.head_dim, dtype, fmt
    )
    return per_block / BLOCK


def capacity_row(mc, dtype: torch.dtype, fmt: KVFormat | None) -> dict:
    per_token = pool_bytes_per_token(mc, dtype, fmt)
    return {
        "bytes_per_token": per_token,
        "blocks_per_gib": int(GIB // (per_token * BLOCK)),
        "tokens_per_gib": int(GIB // per_token),
    }


def trace_hit_rates(trace: list[list[int]], budgets: list[float], per_token: float) -> list[float]:
    """LRU block hit rate of the trace with the device pool given each budget (bytes)."""
    out = []
    for budget in budgets:
        blocks = int(budget // (per_token * TRACE_BLOCK))
        out.append(bi.replay(trace, blocks, LRUPolicy())["hit_rate"])
    return out


def _stored_block(mc, dtype: torch.dtype, fmt: KVFormat | None) -> torch.Tensor:
    """One block of every layer's K/V as a tier stores it ([layers, 2, bs, Hkv, D(+4)])."""
    gen = torch.Generator().manual_seed(0)
    shape = (mc.num_hidden_layers, 2, BLOCK, mc.num_key_value_heads, mc.head_dim)
    values = torch.randn(shape, generator=gen).to(dtype)
    return values if fmt is None else quantize(values, fmt)


def load_row(
    mc, dtype: torch.dtype, fmt: KVFormat | None, pool_fmt: KVFormat | None, reps: int = 50
) -> dict:
    """A block stored in `fmt` and loaded into a pool of `pool_fmt` rows: its encoded bytes, and
    the load's cost (checksum, decode, dequantize where the pool is not quantized, copy into the
    pool), per block and as GB/s of stored bytes."""
    value = encode_block(_stored_block(mc, dtype, fmt), fmt.name if fmt else None)
    tier = tier_format(pool_fmt, fmt.name if fmt else "auto")
    pool = KVCache(
        mc.num_hidden_layers, 4, BLOCK, mc.num_key_value_heads, mc.head_dim, dtype, "cpu",
        kv_format=pool_fmt,
    )  # fmt: skip
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        block = tier.up(decode_block(value), pool.tensor)
        pool.write_blocks([1], [block])
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {
        "stored_bytes": len(value),
        "load_us": seconds * 1e6,
        "load_gbps": len(value) / seconds / 1e9,
    }


def decode_rows(
    model, formats: list[KVFormat | None], workloads: list[str], reps: int
) -> list[dict]:
    """Step times of bench_model's workloads (16 sequences x 1,100 cached tokens, private or
    sharing 1,024) with the pool in each format."""
    rows = []
    for name in workloads:
        row: dict = {"workload": name}
        for fmt in formats:
            model.use_kv_format(fmt)
            kv = KVCache.for_model(model, 1200, BLOCK, fmt)
            wall, _ = time_step(model, kv.tensor, name, reps)
            row[fmt.name if fmt else "model dtype"] = wall * 1e3
        rows.append(row)
    model.use_kv_format(None)
    return rows
