"""Constrained decoding's engine semantics on the tiny models (byte-level tokenizer): mixed batches,
n>1 children, preemption, logit_bias, the grammar's end, dead ends, the compile cache, no leaks."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.kv.admin import CheckIntegrity
from engine.llm import LLM
from engine.request import Prompt
from engine.sampler import apply_token_masks
from engine.sampling_params import SamplingParams
from engine.structured.constraints import (
    Choice,
    ConstraintError,
    JsonObject,
    Regex,
    TaggedJson,
    json_schema,
)
from engine.structured.masks import TokenMasks
from tests.tiny_models import EOS_ID

ENUM = json_schema(
    {"type": "object", "properties": {"k": {"enum": ["v1", "v2", "v3"]}}, "required": ["k"]}
)
PROMPTS = [[10 + i, 20, 30, 40, 50, 60, 70, 80 + i] for i in range(6)]


def greedy(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, "max_tokens": 24, **kw})


def token(llm: LLM, text: str) -> int:
    (only,) = llm.tokenizer.encode(text, add_special_tokens=False)
    return only


def released(llm: LLM) -> bool:
    cache = llm.engine.kv.cache
    cache.check_integrity()
    return cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks


def test_constrained_and_free_rows_share_a_batch(make_llm):
    llm = make_llm(num_blocks=256)
    free = greedy(ignore_eos=True, max_tokens=12)
    alone = [r.outputs[0].token_ids for r in llm.generate(PROMPTS, free)]
    mixed_params = [free if i % 2 else greedy(constraint=ENUM) for i in range(len(PROMPTS))]
    mixed = llm.generate(PROMPTS, mixed_params)
    for i, result in enumerate(mixed):
        out = result.outputs[0]
        if i % 2:
            assert out.token_ids == alone[i]  # the masks of the other rows change nothing here
        else:
            assert json.loads(out.text)["k"] in ("v1", "v2", "v3")
            assert out.finish_reason == "stop"
    assert released(llm)


def test_regex_and_choice_outputs_match_and_stop_at_the_grammar_end(make_llm):
    llm = make_llm(num_blocks=256)
    pattern = r"[a-c]{2,5}x\d"
    params = [
        greedy(constraint=Regex(pattern), ignore_eos=True),
        greedy(constraint=Choice(("alpha", "beta"))),
    ]
    regex, choice = (r.outputs[0] for r in llm.generate(PROMPTS[:2], params))
    assert re.fullmatch(pattern, regex.text) and regex.finish_reason == "stop"  # ignore_eos loses
    assert choice.text in ("alpha", "beta") and choice.finish_reason == "stop"
    assert len(regex.token_ids) < 24


def test_n3_children_each_follow_the_grammar(make_llm):
    llm = make_llm(num_blocks=256)
    word = {"type": "object", "properties": {"k": {"type": "string", "pattern": "^[a-c]{1,5}$"}}}
    tagged = TaggedJson("<c>", json_schema({**word, "required": ["k"]}).schema, "</c>", True, ",")
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=60, constraint=tagged)
    outs = llm.generate([PROMPTS[0]], params)[0].outputs
    assert len(outs) == 3
    for out in outs:
        calls = re.fullmatch(r"<c>(.*?)</c>(?:,<c>(.*?)</c>)*", out.text)
        assert calls is not None, out.text
        assert all(re.fullmatch("[a-c]{1,5}", json.loads(c)["k"]) for c in calls.groups() if c)
    assert len({o.text for o in outs}) > 1  # the children sample on their own
    assert released(llm)


def test_preemption_mid_json_gives_the_same_tokens(make_llm):
    schema = json_schema(
        {
            "type": "object",
            "properties": {"a": {"type": "string", "maxLength": 30}, "b": {"type": "boolean"}},
            "required": ["a", "b"],
        }
    )
    params = greedy(constraint=schema, max_tokens=40, logprobs=1)
    prompts = PROMPTS * 2

    def run(num_blocks: int) -> tuple[list, LLM]:
        llm = make_llm(num_blocks=num_blocks, deterministic=True)
        outs = [
            (r.outputs[0].token_ids, r.outputs[0].logprobs) for r in llm.generate(prompts, params)
        ]
        return outs, llm

    want, _ = run(512)
    got, llm = run(14)  # 56 token slots for 12 sequences of up to 48: preempted while decoding
    assert llm.engine.stats.preemptions > 0
    assert got == want
    assert released(llm)


def test_logit_bias_forces_and_bans_tokens(make_llm):
    llm = make_llm(num_blocks=256)
    free = greedy(ignore_eos=True, max_tokens=6)
    base = llm.generate([PROMPTS[0]], free)[0].outputs[0].token_ids
    forced = llm.generate(
        [PROMPTS[0]], greedy(ignore_eos=True, max_tokens=6, logit_bias=((77, 100.0),))
    )
    assert forced[0].outputs[0].token_ids == [77] * 6
    banned = tuple((t, -100.0) for t in set(base))
    other = llm.generate([PROMPTS[0]], greedy(ignore_eos=True, max_tokens=6, logit_bias=banned))
    assert not set(other[0].outputs[0].token_ids) & set(base)
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((5, 101.0),))
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=((-1, 1.0),))
    with pytest.raises(ValueError, match="vocabulary"):
        llm.generate([PROMPTS[0]], greedy(logit_bias=((10_000, 1.0),)))


def test_logprobs_are_those_of_the_constrained_distribution(make_llm):
    llm = make_llm(num_blocks=256)
    out = llm.generate([PROMPTS[0]], greedy(constraint=Choice(("ab", "ac")), logprobs=5))[0]
    first = out.outputs[0].top_logprobs[0]
    assert set(first) == {token(llm, "a")}  # the only allowed token, renormalised: logprob 0
    assert out.outputs[0].logprobs[0] == pytest.approx(0.0, abs=1e-6)


def test_eos_only_where_the_grammar_accepts(make_llm):
    llm = make_llm(num_blocks=256)
    # a +100 bias on EOS: taken as soon as the grammar may end, never before
    params = greedy(constraint=Regex("[a-z]{3,6}"), logit_bias=((EOS_ID, 100.0),))
    out = llm.generate([PROMPTS[0]], params)[0].outputs[0]
    assert re.fullmatch("[a-z]{3}", out.text) and out.token_ids[-1] == EOS_ID


def test_a_dead_end_ends_the_request_with_an_error(make_llm):
    llm = make_llm(num_blocks=256)
    engine = llm.engine
    engine.add_request("dead", Prompt(PROMPTS[0]), greedy(constraint=ENUM))
    engine.add_request("free", Prompt(PROMPTS[1]), greedy(ignore_eos=True, max_tokens=4))
    engine.step()  # prefill: both sampled a first token
    seq = engine.requests["dead"].seqs[0]
    assert not seq.matcher.accept(token(llm, "z"))  # the grammar rejects it: the matcher is dead
    finished = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished:
                finished[out.request_id] = out
    dead = finished["dead"].outputs[0]
    assert dead.finish_reason == "error" and "dead end" in dead.error
    assert finished["free"].outputs[-1].finish_reason == "length"  # its neighbour runs on
    assert released(llm)


def test_a_rejected_token_ends_the_sequence_with_an_error(make_llm):
    llm = make_llm(num_blocks=256)
    engine = llm.engine
    engine.add_request("r", Prompt(PROMPTS[0]), greedy(constraint=ENUM))
    seq = engine.requests["r"].seqs[0]
    assert engine.guide.advance(seq, token(llm, "{")) is None
    assert engine.guide.advance(seq, token(llm, "x")) == "error"
    assert "rejected token" in seq.error


def test_masks_apply_to_their_rows_only():
    import torch

    logits = torch.zeros(3, 40)
    bitmask = torch.zeros(1, 2, dtype=torch.int32)
    bitmask[0, 1] = 1 << 3  # token 35 only
    out = apply_token_masks(logits, TokenMasks([1], bitmask))
    assert torch.isinf(out[1]).sum() == 39 and out[1, 35] == 0
    assert torch.equal(out[[0, 2]], logits[[0, 2]])


def test_bad_and_unsupported_constraints_raise_constraint_error(make_llm):
    llm = make_llm(num_blocks=64)
    bad = [
        json_schema({"type": "objectx"}),
        json_schema({"type": "array", "uniqueItems": True}),  # unsupported keyword
        Regex("(unclosed"),
        Choice(()),
    ]
    for constraint in bad:
        with pytest.raises(ConstraintError):
            llm.generate([PROMPTS[0]], greedy(constraint=constraint))
    assert not llm.engine.has_unfinished()
    assert llm.engine.stats.requests_rejected == len(bad)


def test_prepare_constraints_compiles_once_off_the_engine_thread(tiny_llama):
    engine = AsyncEngine(
        EngineConfig(model=str(tiny_llama), dtype="float32", block_size=4, num_blocks=64)
    )
    engine.start()
    try:

        async def main() -> list[str]:
            await engine.prepare_constraints([ENUM, ENUM, JsonObject()])
            with pytest.raises(ConstraintError, match="uniqueItems"):
                await engine.prepare_constraints([json_schema({"uniqueItems": True})])
            stream = engine.generate(Prompt(PROMPTS[0]), greedy(constraint=ENUM), "r")
            return [d.text async for out in stream for d in out.outputs]

        text = "".join(asyncio.run(main()))
        assert json.loads(text)["k"] in ("v1", "v2", "v3")
        grammars = engine.engine.grammars
        assert len(grammars) == 2 and grammars.misses == 3 and grammars.hits >= 1
        engine.admin(CheckIntegrity())
    finally:
        engine.shutdown()


def test_the_compile_cache_compiles_a_spec_once_across_threads_and_evicts_lru(tiny_llama):
    from concurrent.futures import ThreadPoolExecutor

    from engine.structured.compiler import GrammarCompiler

    text = (tiny_llama / "tokenizer.json").read_text()
    grammars = GrammarCompiler(text, 320, [EOS_ID], capacity=2)
    with ThreadPoolExecutor(8) as pool:
        compiled = list(pool.map(lambda _: grammars.compile(ENUM), range(8)))
    assert all(c is compiled[0] for c in compiled)
    assert (grammars.misses, grammars.hits) == (1, 7)
    grammars.compile(Regex("a+"))
    grammars.compile(Choice(("x",)))  # capacity 2: ENUM, the least recently used, goes
    assert len(grammars) == 2
    assert grammars.compile(ENUM) is not compiled[0] and grammars.misses == 4


def test_repeated_tagged_json_ends_after_its_cap(make_llm):
    from engine.structured.compiler import MAX_TAGGED_REPEATS

    llm = make_llm(num_blocks=512)
    tagged = TaggedJson("<c>", ENUM.schema, "</c>", repeat=True, separator=",")
    out = llm.generate([PROMPTS[0]], greedy(constraint=tagged, max_tokens=600))[0].outputs[0]
    assert out.finish_reason == "stop"  # never cut off inside a call by max_tokens
    calls = out.text.split(",")
    assert 1 <= len(calls) <= MAX_TAGGED_REPEATS
    assert all(json.loads(c.removeprefix("<c>").removesuffix("</c>"))["k"] for c in calls)


def test_stop_strings_and_max_tokens_still_end_a_constrained_output(make_llm):
    llm = make_llm(num_blocks=256)
    word = Regex("[a-c]{12}")
    free = llm.generate([PROMPTS[0]], greedy(constraint=word))[0].outputs[0].text
    assert re.fullmatch("[a-c]{12}", free)
    cut = free[3]
    stopped = llm.generate([PROMPTS[0]], greedy(constraint=word, stop=(cut,)))[0].outputs[0]
    assert stopped.finish_reason == "stop" and stopped.text == free[: free.index(cut)]
    short = llm.generate([PROMPTS[0]], greedy(constraint=word, max_tokens=5))[0].outputs[0]
    assert short.finish_reason == "length" and short.text == free[:5]
