"""Engine behaviour on a tiny model: prefix cache on/off, cached-token counts, batch invariance,
preemption, rejection, seeds, stop strings/tokens, parallel sampling, abort."""

from __future__ import annotations

import random

import pytest

from engine.kv.admin import CacheStatsOp, CheckIntegrity
from engine.llm import LLM
from engine.request import Prompt, RequestTooLarge
from engine.sampling_params import SamplingParams

BS = 4
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


def _tokens(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 250) for _ in range(n)]


def _llm(path, **kw) -> LLM:
    kw.setdefault("num_blocks", 256)
    return LLM(str(path), dtype="float32", block_size=BS, **kw)


def _texts(outs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outs]


def _assert_all_released(llm: LLM) -> None:
    cache = llm.engine.kv.cache
    cache.check_integrity()
    assert cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks


@pytest.fixture(scope="module")
def reference(tiny_llama):
    """Each prompt alone, cache off: the outputs everything else must reproduce."""
    llm = _llm(tiny_llama, enable_prefix_caching=False)
    prompts = _prompts()
    return {i: _texts(llm.generate([p], GREEDY))[0] for i, p in enumerate(prompts)}


def _prompts() -> list[list[int]]:
    shared = _tokens(12, 0)  # 3 blocks
    return [shared + _tokens(5, 1), shared + _tokens(6, 2), _tokens(9, 3), _tokens(23, 4)]


def test_second_request_reuses_shared_three_blocks(tiny_llama, reference):
    llm = _llm(tiny_llama)
    prompts = _prompts()
    first = llm.generate([prompts[0]], GREEDY)[0]
    second = llm.generate([prompts[1]], GREEDY)[0]
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == 3 * BS
    assert second.cached_tokens_by_tier == {"device": 3 * BS}
    assert _texts([first, second]) == [reference[0], reference[1]]
    again = llm.generate([prompts[0]], GREEDY)[0]  # whole prompt but the last token's block
    assert again.num_cached_tokens == (len(prompts[0]) - 1) // BS * BS
    assert again.outputs[0].token_ids == reference[0]
    _assert_all_released(llm)


def test_cache_on_and_off_identical(tiny_llama, reference):
    prompts = _prompts() * 2
    for caching in (True, False):
        llm = _llm(tiny_llama, enable_prefix_caching=caching)
        outs = llm.generate(prompts, GREEDY)
        assert _texts(outs) == [reference[i % 4] for i in range(8)]
        _assert_all_released(llm)


def test_generated_tokens_are_cached_for_the_next_turn(tiny_llama):
    llm = _llm(tiny_llama)
    prompt = _tokens(10, 5)
    out = llm.generate([prompt], GREEDY)[0]
    turn2 = prompt + out.outputs[0].token_ids + _tokens(6, 6)
    second = llm.generate([turn2], GREEDY)[0]
    # every block whose KV was computed (all but the last generated token) is reused
    computed = len(prompt) + len(out.outputs[0].token_ids) - 1
    assert second.num_cached_tokens == computed // BS * BS


def test_batch_and_chunking_invariance(tiny_llama, reference):
    prompts = _prompts()
    for kw in ({"max_num_batched_tokens": 7}, {"max_num_seqs": 1}, {"max_num_batched_tokens": 1}):
        llm = _llm(tiny_llama, **kw)
        assert _texts(llm.generate(prompts, GREEDY)) == [reference[i] for i in range(4)]


def test_preemption_under_tiny_kv_budget(tiny_llama, reference):
    prompts = _prompts() * 3
    llm = _llm(tiny_llama, num_blocks=12)
    outs = llm.generate(prompts, GREEDY)
    assert _texts(outs) == [reference[i % 4] for i in range(12)]
    assert llm.engine.stats.preemptions > 0
    _assert_all_released(llm)


def test_oversized_request_rejected_clearly(tiny_llama):
    llm = _llm(tiny_llama, num_blocks=8)
    with pytest.raises(RequestTooLarge, match="KV blocks"):
        llm.generate([_tokens(30, 7)], SamplingParams(max_tokens=8))
    llm = _llm(tiny_llama, max_model_len=16)
    with pytest.raises(RequestTooLarge, match="context window"):
        llm.generate([_tokens(16, 7)], GREEDY)
    ok = llm.generate([_tokens(10, 7)], GREEDY)[0]
    assert ok.outputs[0].finish_reason == "length" and len(ok.outputs[0].token_ids) == 6


def test_the_front_refuses_bad_input_before_the_engine_sees_it(tiny_llama):
    llm = _llm(tiny_llama)
    with pytest.raises(ValueError, match="empty"):
        llm.generate([_tokens(5, 1), []], GREEDY)  # one bad prompt: none of the batch runs
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([_tokens(5, 1)], SamplingParams(logit_bias=((10_000, 1.0),)))
    assert not llm.engine.has_unfinished() and llm.engine.stats.requests_rejected == 0
    with pytest.raises(AssertionError):  # the engine asserts what the fronts check
        llm.engine.add_request("r", Prompt([]), GREEDY)


def test_seeds_reproducible(tiny_llama):
    llm = _llm(tiny_llama)
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=42, ignore_eos=True)
    alone = _texts(llm.generate([_tokens(9, 8)], params))[0]
    batched = _texts(llm.generate([_tokens(9, 8), _tokens(13, 9)], [params, GREEDY]))[0]
    assert alone == batched
    other = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=43, ignore_eos=True)
    assert _texts(llm.generate([_tokens(9, 8)], other))[0] != alone


def test_stop_strings_and_stop_tokens(tiny_llama):
    llm = _llm(tiny_llama)
    prompt = _tokens(8, 10)
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    full = llm.generate([prompt], params)[0].outputs[0]
    stop = full.text[3:5]
    cut = llm.generate([prompt], SamplingParams(**{**vars(params), "stop": (stop,)}))[0]
    assert cut.outputs[0].finish_reason == "stop"
    assert cut.outputs[0].text == full.text[: full.text.find(stop)]
    tok = full.token_ids[4]
    by_token = llm.generate([prompt], SamplingParams(**{**vars(params), "stop_token_ids": (tok,)}))
    out = by_token[0].outputs[0]
    assert (
        out.finish_reason == "stop"
        and out.token_ids == full.token_ids[: full.token_ids.index(tok) + 1]
    )


@pytest.mark.parametrize("caching", [True, False])
def test_parallel_sampling_shares_prompt_blocks(tiny_llama, reference, caching):
    llm = _llm(tiny_llama, enable_prefix_caching=caching)
    prompt = _prompts()[0]  # 17 tokens: 4 full blocks and a partial one of 1 token
    greedy = SamplingParams(n=3, temperature=0, max_tokens=10, ignore_eos=True)
    out = llm.generate([prompt], greedy)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert all(c.token_ids == reference[0] for c in out.outputs)
    sampled = SamplingParams(n=4, temperature=1.0, max_tokens=10, seed=1, ignore_eos=True)
    out = llm.generate([prompt], sampled)[0]
    assert len({tuple(c.token_ids) for c in out.outputs}) > 1
    # the siblings were cache hits of the first one's prompt: each computed only the partial
    # block (here its last token, for its own logits), 2 + 3 of them
    assert llm.engine.stats.prefill_tokens <= 2 * len(prompt) + 2 + 3
    _assert_all_released(llm)


def test_abort_frees_blocks(tiny_llama):
    llm = _llm(tiny_llama)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True, n=2)
    for i in range(3):
        engine.add_request(f"r{i}", Prompt(_tokens(11, 20 + i)), params)
    for _ in range(3):
        engine.step()
    assert engine.kv.stats().referenced > 0
    out = engine.abort("r1")
    assert out.finished and all(c.finish_reason == "abort" for c in out.outputs)
    engine.abort("r0")
    engine.abort("r2")
    assert not engine.has_unfinished() and engine.abort("r2") is None
    _assert_all_released(llm)
    assert engine.step() == []


def test_chat_uses_template_and_stops_at_eos(tiny_llama):
    llm = _llm(tiny_llama)
    messages = [{"role": "user", "content": "hi"}]
    out = llm.chat(messages, SamplingParams(temperature=0, max_tokens=5))[0]
    expected = llm.tokenizer.apply_chat_template(messages)
    assert out.prompt_token_ids == expected
    assert out.outputs[0].finish_reason in ("stop", "length")


def test_chat_renders_tools_with_the_shared_template(tiny_llama):
    llm = _llm(tiny_llama)
    messages = [{"role": "user", "content": "weather?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    params = SamplingParams(temperature=0, max_tokens=1)
    out = llm.chat(messages, params, tools=tools)[0]
    assert out.prompt_token_ids == llm.tokenizer.apply_chat_template(messages, tools=tools)
    assert "get_weather" in llm.tokenizer.decode(out.prompt_token_ids)
    assert out.prompt_token_ids != llm.chat(messages, params)[0].prompt_token_ids


def test_request_blocked_by_pinned_blocks_is_aborted_not_spun(tiny_llama):
    llm = _llm(tiny_llama, num_blocks=16)
    prompt = _tokens(36, 40)
    llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1))
    kv = llm.engine.kv
    assert kv.pin(llm.engine.namespace, prompt) == 8 * BS  # capped at half the pool
    out = llm.generate([_tokens(40, 41)], GREEDY)[0]
    assert out.outputs[0].finish_reason == "abort"
    kv.unpin(llm.engine.namespace, prompt)
    assert llm.generate([_tokens(40, 41)], GREEDY)[0].outputs[0].finish_reason == "length"
    _assert_all_released(llm)


@pytest.mark.parametrize("length, computed", [(24, 1), (23, 3)])
def test_a_fully_cached_prompt_computes_only_its_last_token(make_llm, length, computed):
    """4-token blocks: a repeat of a block-aligned prompt copies the tree's last block and
    computes one token; an unaligned one computes the tail no full block holds."""
    llm = make_llm(num_blocks=64)
    prompt = [(7 * i + 3) % 250 + 3 for i in range(length)]
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    cold = llm.generate([prompt], params)[0]
    before = llm.engine.stats.prefill_tokens
    warm = llm.generate([prompt], params)[0]
    assert llm.engine.stats.prefill_tokens - before == computed
    assert warm.num_cached_tokens == length - computed
    assert warm.outputs[0].token_ids == cold.outputs[0].token_ids
    llm.engine.admin(CheckIntegrity())  # raises on a leak or a broken invariant
    assert llm.engine.admin(CacheStatsOp()).referenced == 0


def test_closing_an_engine_frees_its_kv_pool_without_a_collection(tiny_llama):
    """The engine's parts hold each other, so the cycle collector alone would free a closed
    engine's pool at its next pass: close() frees it at once (a process that builds engines one
    after another, a benchmark's rows, no longer piles them up)."""
    import gc
    import weakref

    llm = _llm(tiny_llama)
    llm.generate([_tokens(12, 1)], GREEDY)
    pool = weakref.ref(llm.engine.kv.kv_cache.tensor)
    gc.disable()
    try:
        llm.engine.close()
        assert pool() is None
        assert llm.engine.kv.kv_cache.nbytes == 0
    finally:
        gc.enable()
