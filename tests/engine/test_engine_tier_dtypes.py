"""The spill tiers' row format (--tier-kv-dtype) through a real engine: a quantized pool's blocks
go down and come back bit for bit, a pool of the model's dtype spills quantized blocks that come
back dequantized, a damaged scale is caught, and engines of different tier formats sharing one
Redis never read each other's blocks."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.kv.admin import Flush, Lookup
from engine.kv.quant import KV_FORMATS, dequantize, quantize
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from radixcache.hashing import block_hashes
from storage.codec import HEADER_SIZE, PACKED_CODES
from storage.config import TierConfig
from tests.redis_server import RedisServer
from tests.tier_workload import PARAMS as TIER_PARAMS
from tests.tier_workload import cache_off_reference, tier_prompts, token_ids

PARAMS = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
BLOCKS = 5  # full blocks of a 21-token prompt's tokens[:-1] (4-token blocks)


def prompt(seed: int = 3) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(21)]


def device_blocks(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """The device pool's blocks of the prefix of `tokens`: [blocks, layers, 2, bs, Hkv, row]."""
    engine = llm.engine
    ids = engine.kv.cache.peek(engine.namespace, tokens).block_ids
    assert len(ids) == BLOCKS
    return torch.stack([engine.kv.kv_cache.tensor[:, :, i].clone() for i in ids])


def evict_all(llm: LLM) -> None:
    llm.engine.admin(Flush())
    assert llm.engine.kv.tiers.store.wait_idle(10)


def tier_blocks(llm: LLM, tokens: list[int]) -> torch.Tensor:
    """What the tiers hold of the prefix of `tokens`, under the tiers' namespace."""
    engine = llm.engine
    tiers = engine.kv.tiers
    hashes = block_hashes(engine.namespace, tokens)[:BLOCKS]
    loaded = tiers.store.load_prefix(tiers.fmt.namespace(engine.namespace), hashes, 5.0)
    assert len(loaded.blocks) == BLOCKS
    return torch.stack(loaded.blocks)


@pytest.mark.parametrize("pool", ["int8", "fp8_e4m3"])
def test_a_quantized_pool_spills_its_packed_rows_bit_for_bit(make_llm, pool: str) -> None:
    llm = make_llm(num_blocks=64, kv_cache_dtype=pool, tiers=TierConfig(host_bytes=8 << 20))
    tokens = prompt()
    first = llm.generate([tokens], PARAMS)[0]
    before = device_blocks(llm, tokens)
    assert before.dtype == torch.uint8 and before.shape[-1] == 16 + 4  # codes, then the scale
    evict_all(llm)
    ns = llm.engine.namespace  # auto: the keys are the device namespace's, as before the flag
    assert llm.engine.kv.tiers.store.locate(ns, block_hashes(ns, tokens)) == ["host"] * BLOCKS
    assert torch.equal(tier_blocks(llm, tokens), before)
    again = llm.generate([tokens], PARAMS)[0]
    assert again.cached_tokens_by_tier.get("host", 0) == BLOCKS * 4
    assert torch.equal(device_blocks(llm, tokens), before)  # the pool gets its own bytes back
    assert again.outputs[0].token_ids == first.outputs[0].token_ids


@pytest.mark.parametrize("tier", ["int8", "fp8_e5m2"])
def test_a_bfloat16_pool_spills_quantized_blocks_and_loads_dequantize(make_llm, tier: str) -> None:
    tiers = TierConfig(host_bytes=8 << 20, kv_dtype=tier)
    llm = make_llm(num_blocks=64, dtype="bfloat16", tiers=tiers)
    fmt = KV_FORMATS[tier]
    tokens = prompt()
    llm.generate([tokens], PARAMS)
    before = device_blocks(llm, tokens)
    assert before.dtype == torch.bfloat16
    evict_all(llm)
    assert llm.engine.admin(Lookup(tokens))["host"] == BLOCKS * 4  # under the tiers' namespace
    stored = tier_blocks(llm, tokens)
    assert torch.equal(stored, quantize(before, fmt))  # what went in, bit for bit
    host = llm.engine.kv.tiers.store.tiers[0]
    per_block = HEADER_SIZE + stored[0].numel()  # a byte a value, 4 a row: not bfloat16's 2
    assert host.used_bytes() == len(host) * per_block < len(host) * (HEADER_SIZE + before[0].nbytes)
    written = llm.engine.snapshot().tiers.tiers["host"].stats  # /v1/cache/stats's block_bytes
    assert written.bytes_written == written.blocks_written * per_block
    again = llm.generate([tokens], PARAMS)[0]
    assert again.cached_tokens_by_tier.get("host", 0) == BLOCKS * 4
    want = dequantize(quantize(before, fmt), fmt, torch.bfloat16)
    assert torch.equal(device_blocks(llm, tokens), want)  # dequantized on the way in


def test_a_hybrid_pool_spills_quantized_blocks_of_both_pools(make_llm, windowed_models) -> None:
    """Qwen2 with a windowed layer: a stored block holds every layer's KV (the full pool's and
    the window pool's), quantized as one; a load puts the full layers' part back dequantized."""
    tiers = TierConfig(host_bytes=8 << 20, kv_dtype="int8")
    llm = make_llm(
        windowed_models["qwen2-swa"], num_blocks=64, release_window_blocks=False, tiers=tiers
    )
    kv, windows = llm.engine.kv.kv_cache, llm.engine.kv.windows
    tokens = prompt()
    llm.generate([tokens], PARAMS)
    ids = llm.engine.kv.cache.peek(llm.engine.namespace, tokens).block_ids
    before = torch.stack([kv.block_kv(f, windows.twin_of(f)) for f in ids])
    evict_all(llm)
    assert torch.equal(tier_blocks(llm, tokens), quantize(before, KV_FORMATS["int8"]))
    again = llm.generate([tokens], PARAMS)[0]
    assert again.cached_tokens_by_tier.get("host", 0) == BLOCKS * 4
    full = list(kv.groups.full_layers)
    want = dequantize(quantize(before, KV_FORMATS["int8"]), KV_FORMATS["int8"])[:, full]
    after = device_blocks(llm, tokens)  # the full layers' pool
    assert torch.equal(after, want)


def test_the_codec_names_every_quantized_format() -> None:
    assert set(PACKED_CODES) == set(KV_FORMATS)  # storage keeps the names, not the math


def test_a_quantized_pool_with_another_tier_format_is_refused(make_llm) -> None:
    with pytest.raises(ValueError, match="tier-kv-dtype fp8_e4m3 with --kv-cache-dtype int8"):
        make_llm(kv_cache_dtype="int8", tiers=TierConfig(host_bytes=1 << 20, kv_dtype="fp8_e4m3"))
    with pytest.raises(ValueError, match="tier kv dtype must be one of"):
        TierConfig(host_bytes=1 << 20, kv_dtype="bfloat16")


@pytest.mark.parametrize(("pool", "tier"), [("int8", "auto"), ("auto", "int8")])
def test_a_damaged_scale_on_disk_is_refused_and_recomputed(
    make_llm, tmp_path: Path, pool: str, tier: str
) -> None:
    tiers = TierConfig(disk_path=tmp_path / "disk", kv_dtype=tier)
    llm = make_llm(num_blocks=64, kv_cache_dtype=pool, tiers=tiers)
    tokens = prompt()
    first = llm.generate([tokens], PARAMS)[0]
    evict_all(llm)
    engine = llm.engine
    disk = engine.kv.tiers.store.tiers[0]
    h0 = block_hashes(engine.namespace, tokens)[0]
    path = disk.path_of(engine.kv.tiers.fmt.namespace(engine.namespace), h0)
    data = bytearray(path.read_bytes())
    row = HEADER_SIZE + 7 * (16 + 4)  # the 8th row: 16 code bytes, then its float32 scale
    data[row + 16 + 3] ^= 0x01  # the scale's exponent byte
    path.write_bytes(bytes(data))
    again = llm.generate([tokens], PARAMS)[0]
    assert again.outputs[0].token_ids == first.outputs[0].token_ids  # recomputed
    assert again.cached_tokens_by_tier.get("disk", 0) == 0
    assert disk.stats.corrupt == 1 and not path.exists()


def test_engines_of_different_tier_formats_share_a_redis_without_reading_each_other(
    make_llm, tiny_llama: Path, tmp_path: Path, redis_server: RedisServer
) -> None:
    """A spills float32 blocks, B (write-through) int8 ones into the same Redis under the same
    prefix; their block hashes are the same (same model, same device dtype), their keys not."""
    prompts = tier_prompts()[:4]
    expected = cache_off_reference(tiny_llama, prompts)
    shared = {"redis_url": redis_server.url, "redis_prefix": "shared"}
    a = make_llm(num_blocks=128, tiers=TierConfig(**shared))
    assert token_ids(a.generate(prompts, TIER_PARAMS)) == expected
    evict_all(a)
    assert a.engine.admin(Lookup(prompts[0]))["redis"] == 48  # its 12 blocks
    b_tiers = TierConfig(**shared, kv_dtype="int8", write_policy="write-through")
    b = make_llm(num_blocks=128, tiers=b_tiers)
    assert b.engine.admin(Lookup(prompts[0]))["redis"] == 0  # A's blocks are not B's
    # one at a time: B's later prompts find the shared prefix on its device, never its own
    # freshly published blocks in Redis (submitted together, one may be admitted while the
    # prefix is still being computed and load it back from Redis once B has published it)
    outs = [b.generate([p], TIER_PARAMS)[0] for p in prompts]
    assert token_ids(outs) == expected  # computed, none of A's float32 bytes read as int8
    hits = [dict(o.cached_tokens_by_tier) for o in outs]
    assert all(h.get("redis", 0) == 0 for h in hits), hits
    assert b.engine.kv.tiers.store.wait_idle(10)
    redis = b.engine.kv.tiers.store.tiers[0]
    assert redis.stats.hits == 0 and redis.stats.corrupt == 0
    hashes = block_hashes(b.engine.namespace, prompts[0])
    assert b.engine.kv.tiers.lookup(b.engine.namespace, hashes)["redis"] == 48  # published
    evict_all(b)
    assert b.generate(prompts[:1], TIER_PARAMS)[0].cached_tokens_by_tier.get("redis", 0) == 47
    evict_all(a)  # A still finds its own blocks, untouched by B's
    outs = a.generate(prompts, TIER_PARAMS)
    assert token_ids(outs) == expected
    assert outs[0].cached_tokens_by_tier.get("redis", 0) == 47
    assert a.engine.kv.tiers.store.tiers[0].stats.corrupt == 0
