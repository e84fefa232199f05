"""Sliding-window models through the whole engine (float32): greedy tokens equal transformers'
and logprobs close, with prompts 3-4x the window, chunk boundaries across it and decode well past
it; the cache on or off and deterministic mode on or off change no token."""

from __future__ import annotations

import random

import pytest
import torch

from engine.kv.admin import CacheStatsOp
from engine.sampling_params import SamplingParams
from tests.tiny_models import WINDOWS

from .test_llm_parity import hf_greedy

ARCHS = sorted(WINDOWS)
STEPS = 24  # decoded tokens: the last ones attend nothing of the prompt's first window


def prompt_of(arch: str, seed: int, times: float = 3.5) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(int(WINDOWS[arch] * times))]


def hf_logits(path, ids: list[int], **overrides) -> torch.Tensor:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, **overrides
    ).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch", ARCHS)
def test_the_window_changes_the_reference(windowed_models, arch):
    """transformers with the window widened past the prompt (full attention) answers otherwise:
    a test below passing cannot be full attention passing by accident."""
    ids = prompt_of(arch, 0)
    windowed = hf_logits(windowed_models[arch], ids)
    full = hf_logits(windowed_models[arch], ids, sliding_window=10_000)
    w = WINDOWS[arch]
    torch.testing.assert_close(windowed[:w], full[:w], rtol=1e-4, atol=1e-4)
    assert (windowed[w:] - full[w:]).abs().amax(-1).min() > 1e-2


@pytest.mark.parametrize("chunk", [2048, 16, 7], ids=["whole", "chunks16", "chunks7"])
@pytest.mark.parametrize("arch", ARCHS)
def test_windowed_model_matches_transformers(make_llm, windowed_models, arch, chunk):
    path = windowed_models[arch]
    prompts = [prompt_of(arch, 1), prompt_of(arch, 2, times=4), prompt_of(arch, 3, times=0.5)]
    llm = make_llm(path, num_blocks=256, max_num_batched_tokens=chunk)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=3)
    for prompt, out in zip(prompts, llm.generate(prompts, params), strict=True):
        ref_tokens, ref_lps = hf_greedy(path, prompt, STEPS)
        got = out.outputs[0]
        assert got.token_ids == ref_tokens
        for step, ref in enumerate(ref_lps):
            assert got.logprobs[step] == pytest.approx(float(ref.max()), abs=1e-4)
            for tok, lp in got.top_logprobs[step].items():
                assert lp == pytest.approx(float(ref[tok]), abs=1e-4)
    llm.engine.kv.cache.check_integrity()


def conversations(arch: str, seed: int) -> list[list[int]]:
    """Prompts sharing a head 4x the window: whole, cut mid-block and mid-node, and extended."""
    head = prompt_of(arch, seed, times=4)
    rng = random.Random(seed + 1)
    tail = [rng.randrange(3, 250) for _ in range(9)]
    return [
        head + tail,
        head[:-3] + tail[::-1],  # diverges inside the first prompt's node, mid-block
        head[: WINDOWS[arch] + 5] + tail,  # a hit shorter than the head
        head + tail + [rng.randrange(3, 250) for _ in range(2 * WINDOWS[arch])],
    ]


PARAMS = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True, logprobs=1)


def answers(llm, prompts):
    return [(r.outputs[0].token_ids, r.outputs[0].logprobs) for r in llm.generate(prompts, PARAMS)]


@pytest.mark.parametrize("arch", ARCHS)
def test_cache_hits_change_no_token_under_a_window(make_llm, windowed_models, arch):
    path = windowed_models[arch]
    prompts = conversations(arch, 5)
    cold = make_llm(path, num_blocks=256, enable_prefix_caching=False)
    want = answers(cold, prompts)
    warm = make_llm(path, num_blocks=256, max_num_batched_tokens=16)
    for prompt, expected in zip(prompts, want, strict=True):  # one at a time: each hits the last
        ((tokens, logprobs),) = answers(warm, [prompt])
        assert tokens == expected[0]
        assert logprobs == pytest.approx(expected[1], abs=1e-5)
    assert warm.engine.admin(CacheStatsOp()).total().hit_tokens > 4 * WINDOWS[arch]
    # a second turn over the first turn's answer, whose KV the decode steps wrote
    second = [
        p + ids + prompt_of(arch, 9, times=1) for p, (ids, _) in zip(prompts, want, strict=True)
    ]
    got, expected = answers(warm, second), answers(cold, second)
    assert [ids for ids, _ in got] == [ids for ids, _ in expected]
    warm.engine.kv.cache.check_integrity()


@pytest.mark.parametrize("arch", ARCHS)
def test_deterministic_mode_on_off_agree_under_a_window(make_llm, windowed_models, arch):
    """float32: the batch-invariant kernel path (every token through the windowed prefill
    kernel) and the default one give the same tokens; deterministic mode's own answers are
    the same bits for any batch, chunk and cache hit."""
    path = windowed_models[arch]
    prompts = conversations(arch, 7)
    default = answers(make_llm(path, num_blocks=512, enable_prefix_caching=False), prompts)
    det = make_llm(path, num_blocks=512, deterministic=True, enable_prefix_caching=False)
    want = answers(det, prompts)
    assert [ids for ids, _ in want] == [ids for ids, _ in default]
    for batch, chunk in ((1, 16), (4, 7), (4, 2048)):
        llm = make_llm(
            path,
            num_blocks=512,
            deterministic=True,
            max_num_seqs=batch,
            max_num_batched_tokens=chunk,
        )
        assert answers(llm, prompts) == want, (batch, chunk, "cold")
        assert answers(llm, prompts) == want, (batch, chunk, "warm")


@pytest.mark.parametrize("arch", ARCHS)
def test_deterministic_bfloat16_keeps_its_bits_under_a_window(make_llm, windowed_models, arch):
    """bf16, where sums in another order show: batch size, chunking and cache hits change no bit
    of a windowed model's answers (the windowed prefill kernel skips whole 64-key blocks)."""
    path = windowed_models[arch]
    prompts = conversations(arch, 11) + [prompt_of(arch, 12, times=12)]  # past a 64-key block
    settings = {"dtype": "bfloat16", "num_blocks": 512, "deterministic": True}
    want = answers(make_llm(path, enable_prefix_caching=False, **settings), prompts)
    assert len({tuple(lp) for _, lp in want}) == len(want)
    for batch, chunk in ((1, 16), (5, 7), (5, 2048)):
        llm = make_llm(path, max_num_seqs=batch, max_num_batched_tokens=chunk, **settings)
        assert answers(llm, prompts) == want, (batch, chunk, "cold")
        assert answers(llm, prompts) == want, (batch, chunk, "warm")
        assert llm.engine.admin(CacheStatsOp()).total().hit_tokens > 0
