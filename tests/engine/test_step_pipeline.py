"""Steps one ahead of their tokens (engine/step_pipeline.py), forced on a CPU: every output must
be the one the step-by-step engine gives, tokens, finish reasons and texts, with stops and ends
landing a step late, sequences preempted or aborted while a step is in flight, and nothing
leaked. (On a CPU the forward is synchronous, so nothing overlaps here: this checks the
bookkeeping; scripts/gpu_check.sh runs the CUDA engine tests with it on by default.) Speculation
is off but in the test of the two together."""

from __future__ import annotations

import random

import pytest

from engine.request import PENDING_TOKEN, Prompt
from engine.sampling_params import SamplingParams


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    head = [rng.randrange(3, 250) for _ in range(24)]
    return [head + [rng.randrange(3, 250) for _ in range(rng.randrange(2, 40))] for _ in range(n)]


def _run(llm, prompts, params) -> list[tuple]:
    outs = llm.generate(prompts, params)
    return [
        (c.token_ids, c.finish_reason, c.text)
        for o in outs
        for c in sorted(o.outputs, key=lambda c: c.index)
    ]


def _released(llm) -> bool:
    cache = llm.engine.kv.cache
    cache.check_integrity()
    return cache.num_free_blocks() + cache.num_evictable_blocks() == cache.num_blocks


PARAMS = {
    "greedy": SamplingParams(temperature=0, max_tokens=20, ignore_eos=True),
    # stop tokens the tiny model emits often: sequences end at different steps
    "stops": SamplingParams(temperature=0, max_tokens=24, stop_token_ids=tuple(range(3, 60))),
    "seeded": SamplingParams(temperature=0.9, top_p=0.9, max_tokens=16, seed=7, ignore_eos=True),
    "penalties": SamplingParams(
        temperature=0.8, seed=3, max_tokens=16, repetition_penalty=1.4, ignore_eos=True
    ),
    "n2": SamplingParams(temperature=1.0, n=2, seed=5, max_tokens=12, ignore_eos=True),
    "max1": SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
}


@pytest.mark.parametrize("kind", sorted(PARAMS))
def test_outputs_equal_the_step_by_step_engine(make_llm, kind) -> None:
    prompts = _prompts(7)
    params = PARAMS[kind]
    want = _run(make_llm(speculative="off", async_scheduling=False), prompts, params)
    llm = make_llm(speculative="off", async_scheduling=True)
    assert _run(llm, prompts, params) == want
    assert llm.engine.in_flight is None and _released(llm)
    ahead = llm.engine.stats.steps_run_ahead
    assert ahead == 0 if kind == "max1" else ahead > 0  # a last token never runs ahead


def test_speculation_drafts_between_steps_run_ahead(make_llm) -> None:
    """With the speculator on, every fifth step reads its tokens at once so the next can draft:
    the second pass over the same prompts drafts from the first one's answers, other steps run
    ahead, and the tokens are those of the step-by-step engine with the same speculator."""
    prompts = _prompts(4, seed=4)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    off = make_llm(speculative="cache", async_scheduling=False)
    want = _run(off, prompts, params) + _run(off, prompts, params)
    llm = make_llm(speculative="cache", async_scheduling=True)
    assert _run(llm, prompts, params) + _run(llm, prompts, params) == want
    stats = llm.engine.stats
    assert stats.steps_run_ahead > 0 and stats.spec.num_accepted_tokens > 0
    assert llm.engine.in_flight is None and _released(llm)


def test_logprob_rows_run_ahead_with_their_logprobs(make_llm) -> None:
    """Rows asking for logprobs (and top-k) run ahead too: theirs come back with the tokens, the
    same as step by step."""
    prompts = _prompts(6, seed=1)
    plain = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    logprobs = SamplingParams(temperature=0.7, seed=2, max_tokens=9, ignore_eos=True, logprobs=3)

    def run(llm) -> list:
        engine = llm.engine
        for i, p in enumerate(prompts):
            engine.add_request(f"r{i}", Prompt(p), logprobs if i % 2 == 0 else plain)
        done = {}
        while engine.has_unfinished():
            for out in engine.step():
                for d in out.outputs:
                    got = done.setdefault(out.request_id, [[], [], []])
                    got[0] += d.token_ids
                    got[1] += d.logprobs or []
                    got[2] += d.top_logprobs or []
        return [done, engine.stats.steps_run_ahead]

    (want, _), (got, ahead) = (
        run(make_llm(speculative="off", async_scheduling=False)),
        run(make_llm(speculative="off", async_scheduling=True)),
    )
    assert ahead > 0 and got == want
    assert all(len(got[f"r{i}"][1]) == 9 and len(got[f"r{i}"][2][0]) == 3 for i in (0, 2, 4))
    assert all(PENDING_TOKEN not in v[0] for v in got.values())


def test_preemption_with_a_step_in_flight(make_llm) -> None:
    """A pool too small for every sequence: the scheduler preempts sequences whose last token
    is still on the device; they come back recomputed with it."""
    prompts = _prompts(8, seed=2)
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    settings = {"num_blocks": 40, "max_num_seqs": 8}
    want = _run(make_llm(speculative="off", async_scheduling=False, **settings), prompts, params)
    llm = make_llm(speculative="off", async_scheduling=True, **settings)
    assert _run(llm, prompts, params) == want
    assert llm.engine.scheduler.num_preemptions > 0 and _released(llm)


def test_abort_while_its_token_is_on_the_device(make_llm) -> None:
    llm = make_llm(speculative="off", async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=30, ignore_eos=True)
    for i, p in enumerate(_prompts(3, seed=3)):
        engine.add_request(f"r{i}", Prompt(p), params)
    pending = []
    for _ in range(3):  # the prompts' steps; then each step leaves r1's token on the device
        engine.step()
        ahead = engine.in_flight
        pending = [s for s in ahead.rows if s.request.request_id == "r1"] if ahead else []
    assert pending and pending[0].token_ids[-1] == PENDING_TOKEN
    out = engine.abort("r1")
    assert out.finished and PENDING_TOKEN not in out.outputs[0].token_ids
    while engine.has_unfinished():
        for o in engine.step():
            assert o.request_id != "r1"
            assert all(PENDING_TOKEN not in d.token_ids for d in o.outputs)
    assert engine.in_flight is None and _released(llm)
