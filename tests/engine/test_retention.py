"""A retained prompt (prompt_cache_retention 24h, the engine's retain_prefix): its full blocks,
device hits included, go to the disk tier and outlive the disk LRU pressure that takes an
unretained prompt's; after a device flush a later request loads them back, same output."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from engine.kv.admin import CheckIntegrity, Flush, Lookup
from engine.sampling_params import SamplingParams
from storage.codec import encode_block
from storage.config import TierConfig

PARAMS = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
BLOCK_SHAPE = (2, 2, 4, 2, 16)  # the tiny llama's block: [layers, 2, block_size, kv heads, dim]
BLOCK_BYTES = len(encode_block(torch.zeros(BLOCK_SHAPE)))


def prompt(seed: int, blocks: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(blocks * 4 + 2)]  # + 2: not on a boundary


def test_a_retained_prompt_outlives_disk_pressure_and_comes_back(make_llm, tmp_path: Path) -> None:
    tiers = TierConfig(
        disk_path=tmp_path / "disk", disk_bytes=12 * BLOCK_BYTES, retained_bytes=8 * BLOCK_BYTES
    )
    llm = make_llm(tiers=tiers, num_blocks=24, max_num_seqs=2)
    engine = llm.engine
    assert engine.kv.tiers.block_shape == BLOCK_SHAPE
    store = engine.kv.tiers.store
    kept, plain = prompt(1, 6), prompt(2, 6)
    first = llm.generate([kept, plain], PARAMS)
    # asked again with retention: all 6 blocks are device hits, and retained all the same
    again = llm.generate([kept], PARAMS, retain_prefix=True)
    assert again[0].num_cached_tokens == 24
    assert store.wait_idle(30)
    _, retained = store.stats().retention
    assert (retained.blocks, retained.bytes) == (6, 6 * BLOCK_BYTES)

    llm.generate([prompt(100 + i, 6) for i in range(8)], PARAMS)  # ~50 blocks through the disk
    engine.admin(Flush())
    assert store.wait_idle(30)
    assert store.stats().tiers["disk"].stats.evictions >= 30
    assert engine.admin(Lookup(plain))["disk"] == 0
    found = engine.admin(Lookup(kept))
    assert (found["device"], found["disk"]) == (0, 24)

    back = llm.generate([kept], PARAMS)[0]
    assert back.cached_tokens_by_tier.get("disk") == 24
    assert back.outputs[0].token_ids == first[0].outputs[0].token_ids
    engine.admin(CheckIntegrity())


def test_retain_prefix_needs_a_persistent_tier(make_llm) -> None:
    llm = make_llm(tiers=TierConfig(host_bytes=1 << 20), num_blocks=24)
    assert not llm.engine.kv.can_retain
    with pytest.raises(ValueError, match="persistent"):
        llm.generate([prompt(1, 2)], PARAMS, retain_prefix=True)
