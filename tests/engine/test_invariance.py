"""The cache never changes an answer, bf16 included: greedy outputs (tokens and their logprobs, to
the bit) are the same whether a prefix was computed in this request, in another chunking or batch,
reused from the device tree, or loaded back from host, disk or Redis.

`deterministic=True` sends every token through the native prefill kernel (fixed 64-key tiles from
position 0, summed in order) and every packed matmul through calls of at most the row count this
CPU's oneDNN kernels agree on (engine/models/packed_linear.py: on AMX a row's bits change with the
rows of its call); norms and pointwise ops are per-row. The default mode keeps the decode kernel
for one-token steps and whole-batch matmuls: greedy tokens still agree, logprobs may differ in
the last bits."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.kv.admin import CacheStatsOp, Flush
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from storage.config import TierConfig

PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=1)
# (max running sequences, token budget per step): batch sizes 1/7/16 and chunk sizes 16/64/2048
SHAPES = ((1, 16), (7, 64), (16, 2048), (16, 16), (1, 2048), (7, 16))


def prompts_sharing_a_head(n: int, head: int, vocab_top: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab_top) for _ in range(head)]
    return [
        shared + [rng.randrange(3, vocab_top) for _ in range(rng.randrange(9, 90))]
        for _ in range(n)
    ]


def answers(llm: LLM, prompts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
    return [(r.outputs[0].token_ids, r.outputs[0].logprobs) for r in llm.generate(prompts, PARAMS)]


def engine(make_llm, model: Path, dtype: str, **settings) -> LLM:
    settings = {"max_num_seqs": 16, "max_num_batched_tokens": 2048, **settings}
    return make_llm(model, dtype=dtype, num_blocks=1024, deterministic=True, **settings)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_batch_size_chunk_size_and_cache_hits_change_no_bit(make_llm, tiny_models, dtype):
    model = tiny_models["qwen3"]
    prompts = prompts_sharing_a_head(16, 96, 250)
    want = answers(engine(make_llm, model, dtype, enable_prefix_caching=False), prompts)
    assert len({tuple(lp) for _, lp in want}) == len(want)  # distinct answers: a real check
    for batch, chunk in SHAPES:
        llm = engine(make_llm, model, dtype, max_num_seqs=batch, max_num_batched_tokens=chunk)
        assert answers(llm, prompts) == want, (batch, chunk, "cold")
        assert answers(llm, prompts) == want, (batch, chunk, "warm: device tree hits")
        assert llm.engine.admin(CacheStatsOp()).total().hit_tokens > 0


def test_each_spill_tier_loads_back_the_same_bits(make_llm, tiny_models, tmp_path, redis_server):
    model = tiny_models["llama"]
    prompts = prompts_sharing_a_head(12, 64, 250, seed=1)
    want = answers(engine(make_llm, model, "bfloat16", enable_prefix_caching=False), prompts)
    tiers = {
        "host": TierConfig(host_bytes=1 << 26),
        "disk": TierConfig(disk_path=str(tmp_path / "kv"), disk_bytes=1 << 28),
        "redis": TierConfig(redis_url=redis_server.url),
    }
    for name, config in tiers.items():
        llm = make_llm(model, dtype="bfloat16", num_blocks=40, deterministic=True, tiers=config)
        assert answers(llm, prompts) == want, name  # cold, spilling as it goes
        llm.engine.admin(Flush())
        assert llm.engine.kv.tiers.store.wait_idle(30)
        assert answers(llm, prompts) == want, name  # warm: prefixes come back from the tier
        loaded = llm.engine.kv.tiers.store.stats().tiers[name].stats
        assert loaded.hits > 0, name


def test_a_next_turn_over_decoded_tokens_matches_a_cold_recompute(make_llm, tiny_models):
    """Turn 2 holds turn 1's answer, whose KV the decode steps wrote; recomputed cold, prefill
    writes it: the two must agree, or a cache hit on a conversation would change the reply."""
    model = tiny_models["qwen2"]
    first = prompts_sharing_a_head(8, 48, 250, seed=2)
    rng = random.Random(3)
    warm = engine(make_llm, model, "bfloat16", max_num_batched_tokens=64)
    history = [p + ids for p, (ids, _) in zip(first, answers(warm, first), strict=True)]
    second = [h + [rng.randrange(3, 250) for _ in range(11)] for h in history]
    cold = engine(make_llm, model, "bfloat16", enable_prefix_caching=False)
    assert answers(warm, second) == answers(cold, second)
    assert warm.engine.admin(CacheStatsOp()).total().hit_tokens > 0


@pytest.mark.slow
def test_default_model_bf16_cache_on_off_and_batching(make_llm, default_model_path):
    prompts = prompts_sharing_a_head(4, 96, 40_000, seed=4)
    settings = {"block_size": 16, "max_num_seqs": 4}
    off = engine(make_llm, default_model_path, "bfloat16", enable_prefix_caching=False, **settings)
    want = answers(off, prompts)
    llm = engine(make_llm, default_model_path, "bfloat16", max_num_batched_tokens=64, **settings)
    assert answers(llm, prompts) == want  # chunks of 64, batch of 4
    assert answers(llm, prompts) == want  # device hits
    one = engine(make_llm, default_model_path, "bfloat16", max_num_seqs=1, block_size=16)
    assert answers(one, prompts[::-1]) == want[::-1]  # one at a time, other order


def test_deterministic_is_refused_where_the_prefill_kernel_is_missing(make_llm, tiny_models):
    from engine.attention import make_attention_backend

    with pytest.raises(RuntimeError, match="deterministic mode needs the native prefill kernel"):
        make_attention_backend("cpu", None, None, 64, invariant=True)  # no dtype: no kernel


def test_deterministic_is_refused_on_cuda():
    """No CUDA kernel of the engine is batch-invariant: asking for it there fails at start."""
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="deterministic mode runs on CPU only"):
        EngineConfig(device="cuda", deterministic=True)
