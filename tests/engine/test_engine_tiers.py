"""Engine + spill tiers: evicted blocks go down (write-back), admission loads them back."""

from __future__ import annotations

import random

from engine.llm import LLM
from engine.sampling import SamplingParams
from storage.tiered import TierConfig

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(5)
    return [[rng.randrange(3, 250) for _ in range(21)] for _ in range(4)]


def _llm(path, **kw) -> LLM:
    return LLM(str(path), dtype="float32", block_size=BS, **kw)


def _tokens(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def test_host_tier_loads_back_evicted_prefixes(tiny_llama):
    prompts = _prompts()
    reference = _tokens(
        _llm(tiny_llama, num_blocks=64, enable_prefix_caching=False).generate(prompts, GREEDY)
    )
    llm = _llm(tiny_llama, num_blocks=8, tiers=TierConfig(host_bytes=8 << 20))
    engine = llm.engine
    first = [llm.generate([p], GREEDY)[0] for p in prompts]  # each evicts the previous
    assert _tokens(first) == reference
    engine.tiers.store.wait_idle(10)
    assert engine.lookup(prompts[0])["host"] == 20  # five blocks of tokens[:-1] (all but the last)
    again = llm.generate([prompts[0]], GREEDY)[0]
    assert again.outputs[0].token_ids == reference[0]
    assert again.cached_tokens_by_tier.get("host", 0) == 20
    assert again.num_cached_tokens == 20
    engine.prefix_cache.check_integrity()
    assert engine.snapshot().tiers.tiers["host"].stats.hits >= 5
    engine.close()


def test_disk_tier_survives_a_restart(tiny_llama, tmp_path):
    prompts = _prompts()
    tiers = TierConfig(disk_path=tmp_path / "kv", disk_bytes=64 << 20)
    first = _llm(tiny_llama, num_blocks=64, tiers=tiers)
    want = _tokens(first.generate(prompts[:2], GREEDY))
    first.engine.flush()  # evict everything: write-back to disk
    first.engine.close()
    second = _llm(tiny_llama, num_blocks=64, tiers=tiers)
    outs = second.generate(prompts[:2], GREEDY)
    assert _tokens(outs) == want
    assert all(o.cached_tokens_by_tier.get("disk", 0) == 20 for o in outs)
    second.engine.close()
