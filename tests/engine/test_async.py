"""AsyncEngine: streaming, concurrency, abort, bounded queue, analytics passthroughs."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_engine import AsyncEngine, EngineOverloaded
from engine.config import EngineConfig
from engine.kv.admin import CacheStatsOp, CheckIntegrity, Flush, HottestPrefixes, Lookup, Pin, Unpin
from engine.llm import LLM
from engine.llm_engine import LLMEngine
from engine.outputs import RequestResult
from engine.request import Prompt, RequestTooLarge
from engine.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [Prompt([10 + i, 20, 30, 40, 50, 60, 70, 80, 90, 100 + i]) for i in range(6)]


@pytest.fixture()
def engine(tiny_llama):
    eng = AsyncEngine(
        EngineConfig(model=str(tiny_llama), dtype="float32", block_size=4, num_blocks=128)
    )
    eng.start()
    yield eng
    eng.shutdown()


async def _collect(engine: AsyncEngine, prompt, request_id: str, params=GREEDY) -> list:
    return [out async for out in engine.generate(prompt, params, request_id)]


def test_streams_deltas_matching_offline(engine, tiny_llama):
    offline = LLM(str(tiny_llama), dtype="float32", block_size=4, num_blocks=128)
    expected = [
        o.outputs[0].token_ids for o in offline.generate([p.token_ids for p in PROMPTS], GREEDY)
    ]

    async def main():
        return await asyncio.gather(*(_collect(engine, p, f"r{i}") for i, p in enumerate(PROMPTS)))

    streams = asyncio.run(main())
    for stream, want in zip(streams, expected, strict=True):
        whole = RequestResult("r")
        for out in stream:
            whole.add(out)
        assert stream[-1].finished and whole.outputs[0].token_ids == want
        assert not any(o.finished for o in stream[:-1])
        # each delta carries only its news: one token per step once decoding (no copies)
        assert all(len(o.outputs[0].token_ids) == 1 for o in stream if o.outputs)
    snap = engine.snapshot()
    assert snap.totals.requests_finished == len(PROMPTS) and snap.running == 0
    engine.admin(CheckIntegrity())


def test_lookup_and_cache_passthroughs(engine):
    asyncio.run(_collect(engine, PROMPTS[0], "warm"))
    ids = PROMPTS[0].token_ids
    assert engine.admin(Lookup(ids))["device"] == 8
    assert engine.admin(Lookup(ids, cache_salt="tenant"))["device"] == 0
    assert engine.admin(Pin(ids)) == 8 and engine.admin(Unpin(ids)) == 8
    assert engine.admin(HottestPrefixes(5))
    assert engine.admin(CacheStatsOp()).cached > 0
    assert engine.admin(Flush()) > 0 and engine.admin(Lookup(ids))["device"] == 0


def test_abort_mid_stream_frees_blocks(engine):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        outs = []
        async for out in engine.generate(PROMPTS[1], long, "long"):
            outs.append(out)
            if sum(len(o.outputs[0].token_ids) for o in outs) >= 3:
                engine.abort("long")
        return outs

    outs = asyncio.run(main())
    assert outs[-1].finished and outs[-1].outputs[0].finish_reason == "abort"
    engine.admin(CheckIntegrity())
    stats = engine.admin(CacheStatsOp())
    assert stats.referenced == 0


def test_consumer_leaving_early_aborts(engine):
    long = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)

    async def main():
        gen = engine.generate(PROMPTS[2], long, "gone")
        await gen.__anext__()
        await gen.aclose()

    asyncio.run(main())
    snap = engine.snapshot()  # runs after the abort command that aclose queued
    assert snap.totals.requests_aborted == 1 and snap.cache.referenced == 0


def _config(tiny_llama, **settings) -> EngineConfig:
    return EngineConfig(model=str(tiny_llama), dtype="float32", block_size=4, **settings)


def test_bounded_queue_and_rejections(tiny_llama):
    config = _config(tiny_llama, num_blocks=100, max_num_seqs=1, max_waiting_requests=1)
    engine = AsyncEngine(config)
    engine.start()
    long = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)

    async def main():
        a = engine.generate(PROMPTS[0], long, "a")
        await a.__anext__()  # a runs (the only running slot)
        b = asyncio.ensure_future(engine.generate(PROMPTS[1], long, "b").__anext__())
        await asyncio.sleep(0)  # let b's task register (a scheduler yield, not a wait)
        with pytest.raises(EngineOverloaded):
            await engine.generate(PROMPTS[2], long, "c").__anext__()
        with pytest.raises(RequestTooLarge):
            await engine.generate(Prompt(list(range(3, 500))), long, "d").__anext__()  # > pool
        b.cancel()
        await a.aclose()

    try:
        asyncio.run(main())
        assert engine.admin(CacheStatsOp()).referenced == 0  # runs after every queued command
        assert not engine.has_unfinished()
    finally:
        engine.shutdown()


def test_in_flight_cap_is_the_engines_room_or_the_callers_lower_one(tiny_llama):
    config = _config(tiny_llama, num_blocks=64, max_num_seqs=3, max_waiting_requests=5)
    shared = LLMEngine(config)
    try:
        assert AsyncEngine(config, shared).max_in_flight == 8
        assert AsyncEngine(config, shared, max_in_flight=2).max_in_flight == 2
        assert AsyncEngine(config, shared, max_in_flight=100).max_in_flight == 8
    finally:
        shared.close()
