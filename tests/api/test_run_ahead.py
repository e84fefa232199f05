"""The server with steps run ahead of their tokens (engine/step_pipeline.py; the default on CUDA,
forced here on a CPU, speculation off): concurrent streams answer as the step-by-step engine
does, and clients hanging up while their tokens are on the device leave nothing behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from api.config import ApiConfig
from benchmarks.soak_driver import is_idle, wait_idle
from engine.llm import LLM
from engine.sampling_params import SamplingParams
from tests.api.servers import ENGINE_SETTINGS, Server, engine_config, fresh_text, start_server

AHEAD = {"speculative": "off", "async_scheduling": True}
KINDS = [
    {"max_tokens": 12},
    {"max_tokens": 9, "stop": [" a", " the"]},
    {"max_tokens": 10, "temperature": 0.8, "seed": 4},
]


@pytest.fixture(scope="module")
def ahead_server(tiny_llama: Path) -> Iterator[Server]:
    handle = start_server(engine_config(tiny_llama, **AHEAD), ApiConfig(max_queue=64))
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def step_by_step(tiny_llama: Path) -> LLM:
    return LLM(str(tiny_llama), **{**ENGINE_SETTINGS, **AHEAD, "async_scheduling": False})


def _params(kind: dict) -> SamplingParams:
    return SamplingParams(**{"temperature": 0.0, **kind})


def test_concurrent_streams_answer_as_step_by_step(ahead_server, step_by_step) -> None:
    prompts = [fresh_text(15 + 4 * i, 40 + i) for i in range(6)]
    kinds = [KINDS[i % len(KINDS)] for i in range(len(prompts))]
    want = [
        step_by_step.generate([p], _params(k))[0].outputs[0]
        for p, k in zip(prompts, kinds, strict=True)
    ]
    client = openai.AsyncOpenAI(base_url=ahead_server.url + "/v1", api_key="x", max_retries=0)

    async def one(prompt: str, kind: dict) -> tuple[str, str]:
        stream = await client.completions.create(
            model=ahead_server.model, prompt=prompt, stream=True, **{"temperature": 0, **kind}
        )
        text, reason = "", None
        async for chunk in stream:
            text += "".join(c.text for c in chunk.choices)
            reason = chunk.choices[0].finish_reason or reason
        return text, reason

    async def all_at_once() -> list[tuple[str, str]]:
        return await asyncio.gather(*(one(p, k) for p, k in zip(prompts, kinds, strict=True)))

    got = asyncio.run(all_at_once())
    assert got == [(w.text, w.finish_reason) for w in want]
    assert ahead_server.engine.engine.stats.steps_run_ahead > 0


def test_clients_hanging_up_mid_stream_leave_nothing_behind(ahead_server) -> None:
    body = {"model": ahead_server.model, "max_tokens": 40, "temperature": 0, "stream": True}

    async def hang_up(i: int) -> None:
        async with httpx.AsyncClient(base_url=ahead_server.url, timeout=60) as http:
            payload = {**body, "prompt": fresh_text(20, 60 + i)}
            async with http.stream("POST", "/v1/completions", json=payload) as r:
                assert r.status_code == 200
                events = 0
                async for line in r.aiter_lines():
                    events += line.startswith("data:")
                    if events == 3 + i:
                        return  # the stream closes: the request is aborted

    async def all_at_once() -> None:
        await asyncio.gather(*(hang_up(i) for i in range(5)))

    asyncio.run(all_at_once())
    report = wait_idle(ahead_server.url)
    assert is_idle(report) and report["ok"], report
