"""Speculative decoding on real tiny models: the same tokens (and logprobs, and seeded samples)
with speculation on and off, drafts really accepted (each test asserts it), stops and penalties
seen token by token, constrained rows left alone, no leaked blocks, no draft across tenants."""

from __future__ import annotations

import random

import pytest

from engine.llm import LLM
from engine.request import Prompt
from engine.sampling_params import SamplingParams
from engine.structured.constraints import Regex
from tests.tiny_models import EOS_ID

GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


def _prompts(n: int = 3, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 250) for _ in range(rng.randrange(9, 41))] for _ in range(n)]


def _run(llm: LLM, prompts, params) -> list[tuple[list[int], list[float] | None, str | None]]:
    outs = [r.outputs[0] for r in llm.generate(prompts, params)]
    return [(o.token_ids, o.logprobs, o.finish_reason) for o in outs]


def _two_waves(llm: LLM, prompts, first, second=None) -> list:
    """A first wave, then a second wave of the same prompts (its drafts: the first's output)."""
    return _run(llm, prompts, first) + _run(llm, prompts, second or first)


def _released(llm: LLM) -> bool:
    cache = llm.engine.kv.cache
    cache.check_integrity()
    return cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks


def _spec(llm: LLM):
    return llm.engine.stats.spec


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_greedy_repeat_is_identical_and_drafts_are_accepted(make_llm, tiny_models, arch):
    prompts = _prompts()
    off = _two_waves(make_llm(tiny_models[arch], speculative="off"), prompts, GREEDY)
    on_llm = make_llm(tiny_models[arch], speculative="cache", max_num_seqs=2)
    assert _two_waves(on_llm, prompts, GREEDY) == off
    spec = _spec(on_llm)
    assert spec.num_accepted_tokens > 0.5 * spec.num_draft_tokens > 0
    assert spec.mean_accepted_length > 2
    assert _released(on_llm)


def test_verify_rows_stop_at_a_block_the_tree_already_holds(make_llm):
    """In the second wave the tree holds every block of the first wave's answers: committing one
    switches the sequence to the tree's copy (whose bits may differ, computed in other chunks),
    so no verify step's rows run past the end of such a block; plain decoding reads the
    tree's copy from the next position on, and so do the drafts' next rows."""
    llm = make_llm(speculative="cache", max_num_seqs=2)
    prompts = _prompts()
    first = _run(llm, prompts, GREEDY)
    verified: list[tuple[int, int]] = []  # (row of the last token, draft tokens)
    runner = llm.engine.runner
    execute = runner.execute

    def observe(batch, feed=None):
        for b, draft in batch.drafts.items():
            verified.append((batch.seqs[b].num_tokens - 1, len(draft)))
        return execute(batch, feed)

    runner.execute = observe
    assert _run(llm, prompts, GREEDY) == first
    assert verified and _spec(llm).mean_accepted_length > 1
    bs = llm.engine.config.block_size
    assert all(last // bs == (last + k) // bs for last, k in verified), verified
    assert _released(llm)


def test_bfloat16_greedy_is_identical_with_shared_prefixes(make_llm, tiny_models):
    """bfloat16 rounds each kernel's sums its own way: verify rows attended like plain decode
    rows (the native decode kernel, in the same shared-prefix groups) keep near-ties as they are.
    Six prompts after one 12-token system prompt, decoded together, twice."""
    rng = random.Random(0)
    system = [rng.randrange(3, 250) for _ in range(12)]
    prompts = [
        system + [rng.randrange(3, 250) for _ in range(rng.randrange(5, 20))] for _ in range(6)
    ]
    settings = {"dtype": "bfloat16", "num_blocks": 512}
    off = _two_waves(make_llm(tiny_models["llama"], speculative="off", **settings), prompts, GREEDY)
    llm = make_llm(tiny_models["llama"], speculative="cache", **settings)
    assert llm.engine.runner.model.attention.native is not None
    assert _two_waves(llm, prompts, GREEDY) == off
    spec = _spec(llm)
    assert spec.num_accepted_tokens > 0.5 * spec.num_draft_tokens > 0
    assert _released(llm)


@pytest.mark.slow
def test_ngram_mode_drafts_from_the_requests_own_text(make_llm, default_model_path):
    """The default model asked to repeat a passage of this repository's README (float32)."""
    from pathlib import Path

    passage = (Path(__file__).parents[2] / "README.md").read_text()[:600]
    chat = [{"role": "user", "content": "Repeat the following text exactly:\n\n" + passage}]
    params = SamplingParams(temperature=0, max_tokens=48)
    settings = {"dtype": "float32", "block_size": 16, "num_blocks": 128}
    off = make_llm(default_model_path, speculative="off", **settings).chat(chat, params)
    llm = make_llm(default_model_path, speculative="ngram", **settings)
    on = llm.chat(chat, params)
    assert on[0].outputs[0].token_ids == off[0].outputs[0].token_ids
    assert _spec(llm).num_accepted_tokens > 0
    assert _released(llm)


def test_seeded_sampling_gives_the_same_tokens_on_and_off(make_llm):
    prompts = _prompts()
    params = [SamplingParams(temperature=0.7, seed=7 + i, max_tokens=30) for i in range(3)]
    off = _two_waves(make_llm(speculative="off"), prompts, params)
    llm = make_llm(speculative="cache")
    assert _two_waves(llm, prompts, params) == off
    assert _spec(llm).num_accepted_tokens > 0
    assert _released(llm)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_deterministic_mode_is_bit_identical_in_tokens_and_logprobs(make_llm, tiny_models, dtype):
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
    settings = {"dtype": dtype, "deterministic": True, "num_blocks": 512}
    model = tiny_models["qwen3"]
    off = _two_waves(make_llm(model, speculative="off", **settings), prompts, params)
    llm = make_llm(model, speculative="cache", **settings)
    assert _two_waves(llm, prompts, params) == off
    assert _spec(llm).num_accepted_tokens > 0


def test_stops_and_max_tokens_inside_a_draft(make_llm):
    prompts = _prompts()
    first = _run(make_llm(speculative="off"), prompts, GREEDY)
    stop_token = first[0][0][12]  # the second wave stops on it, mid-draft
    stop_text = make_llm().tokenizer.decode(first[1][0][20:22])
    second = [
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop_token_ids=(stop_token,)),
        SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, stop=(stop_text,)),
        SamplingParams(temperature=0, max_tokens=7, ignore_eos=True),
    ]
    off = _two_waves(make_llm(speculative="off"), prompts, GREEDY, second)
    llm = make_llm(speculative="cache")
    on = _two_waves(llm, prompts, GREEDY, second)
    assert on == off
    assert [r[2] for r in on[3:]] == ["stop", "stop", "length"]
    assert len(on[3][0]) <= 13 and len(on[5][0]) == 7
    assert _spec(llm).num_accepted_tokens > 0
    assert _released(llm)


def test_eos_inside_a_draft(make_llm):
    """The first wave's outputs end at EOS (a small bias on it makes them end within 60 tokens:
    after 10 and 34 tokens, say); the second wave's drafts run into it."""
    prompts = _prompts(6, seed=3)
    params = SamplingParams(temperature=0, max_tokens=60, logit_bias={EOS_ID: 2.0})
    off = _two_waves(make_llm(speculative="off"), prompts, params)
    assert all(r[2] == "stop" for r in off) and max(len(r[0]) for r in off) > 20
    llm = make_llm(speculative="cache")
    assert _two_waves(llm, prompts, params) == off
    assert _spec(llm).num_accepted_tokens > 0
    assert _released(llm)


def test_penalties_see_each_accepted_token(make_llm):
    prompts = _prompts()
    params = SamplingParams(
        temperature=0,
        max_tokens=40,
        ignore_eos=True,
        repetition_penalty=1.3,
        frequency_penalty=0.5,
        presence_penalty=0.3,
    )
    off = _two_waves(make_llm(speculative="off"), prompts, params)
    llm = make_llm(speculative="cache")
    assert _two_waves(llm, prompts, params) == off
    assert _spec(llm).num_accepted_tokens > 0


def test_rejected_drafts_leak_no_block_or_reference(make_llm):
    """The second wave's penalties turn away from the first wave's text: drafts from the tree
    are rejected part-way; the KV of the rejected tokens never reaches the tree."""
    prompts = _prompts(4)
    penalised = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, presence_penalty=2)
    off = _two_waves(make_llm(speculative="off"), prompts, GREEDY, penalised)
    llm = make_llm(speculative="cache", num_blocks=96)
    assert _two_waves(llm, prompts, GREEDY, penalised) == off
    spec = _spec(llm)
    assert 0 < spec.num_accepted_tokens < spec.num_draft_tokens
    assert _released(llm)
    # every cached block holds what the model computes for its tokens: a third wave, cache only
    assert _run(llm, prompts, penalised) == off[4:]


def test_constrained_requests_do_not_speculate(make_llm):
    prompts = _prompts(2)
    regex = SamplingParams(temperature=0, max_tokens=20, constraint=Regex(r"[a-c]{3,12}x"))
    params = [regex, GREEDY]
    off = _two_waves(make_llm(speculative="off"), prompts, params)
    llm = make_llm(speculative="cache")
    on = _two_waves(llm, prompts, params)
    assert on == off
    assert _spec(llm).num_accepted_tokens > 0  # the free row speculated beside it
    constrained = llm.generate(prompts[:1], regex)[0].outputs[0]
    assert constrained.finish_reason == "stop" and constrained.token_ids == off[0][0]


def test_drafts_never_cross_namespaces(make_llm):
    """Tenant a's cached continuation and finished text draft for a's repeat, never for b's."""
    llm = make_llm(speculative="cache")
    prompt = _prompts(1, seed=5)[0]
    llm.generate([prompt], GREEDY, cache_salt="a")
    engine = llm.engine
    proposer = engine.speculator.proposer
    drafts = {}
    for salt in ("a", "b", ""):
        rid = f"probe-{salt}"
        engine.add_request(rid, Prompt(prompt), GREEDY, cache_salt=salt)
        engine.step()  # prefill and the first token
        (seq,) = engine.requests[rid].seqs
        drafts[salt] = proposer.proposals(seq, 8)
        engine.abort(rid)
    assert drafts["a"] and drafts["b"] == [] and drafts[""] == []
    assert _released(llm)


def test_the_suffix_index_holds_at_most_its_bound(make_llm):
    llm = make_llm(speculative_index_tokens=100)
    prompts = _prompts(6)
    llm.generate(prompts, GREEDY)
    index = llm.engine.speculator.proposer.suffix_index
    assert 0 < index.num_tokens <= 100 and index.max_tokens == 100
    with pytest.raises(ValueError, match="speculative_index_tokens"):
        make_llm(speculative_index_tokens=0)
