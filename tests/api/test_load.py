"""Concurrency, client disconnects and the bounded queue."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from api.config import ApiConfig
from engine.kv.admin import CacheStatsOp, CheckIntegrity
from engine.sampling_params import SamplingParams
from engine.stats import EngineSnapshot
from tests.api.servers import Server, engine_config, fresh_text, start_server

LONG = 480  # tokens: a generation that runs long enough to be interrupted


def wait_idle(server: Server, timeout_s: float = 60.0) -> EngineSnapshot:
    """Polls the engine until no request runs or waits and no block is referenced."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        snap = server.engine.snapshot()
        if snap.running == 0 and snap.waiting == 0 and snap.cache.referenced == 0:
            return snap
        time.sleep(0.02)  # polling interval
    raise AssertionError(f"engine not idle: {snap}")


def assert_blocks_free(server: Server) -> None:
    server.engine.admin(CheckIntegrity())
    cache = server.engine.admin(CacheStatsOp())
    assert cache.referenced == 0
    assert cache.free + cache.evictable + cache.pinned == cache.num_blocks


def long_body(server: Server, **kw) -> dict:
    return {
        "model": server.model,
        "prompt": fresh_text(12, 40),
        "max_tokens": LONG,
        "temperature": 0,
        "ignore_eos": True,
        **kw,
    }


def test_32_concurrent_streaming_clients(server, offline) -> None:
    shared = fresh_text(40, 41)
    prompts = [shared + fresh_text(10 + i % 7, 100 + i) for i in range(32)]
    expected = [
        o.outputs[0].text
        for o in offline.generate(prompts, SamplingParams(max_tokens=12, temperature=0.0))
    ]
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)

    async def one(prompt: str) -> tuple[str, str | None]:
        stream = await client.completions.create(
            model=server.model, prompt=prompt, max_tokens=12, temperature=0, stream=True
        )
        text, reason = "", None
        async for chunk in stream:
            for c in chunk.choices:
                text += c.text
                reason = c.finish_reason or reason
        return text, reason

    async def run() -> list[tuple[str, str | None]]:
        return await asyncio.gather(*(one(p) for p in prompts))

    results = asyncio.run(run())
    assert [t for t, _ in results] == expected
    assert all(r is not None for _, r in results)
    wait_idle(server)
    assert_blocks_free(server)


def test_disconnect_mid_stream_aborts_and_frees_blocks(server) -> None:
    wait_idle(server)
    aborted = server.engine.snapshot().totals.requests_aborted
    body = long_body(server, stream=True)
    with (
        httpx.Client(base_url=server.url, timeout=60.0) as client,
        client.stream("POST", "/v1/completions", json=body) as r,
    ):
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: {") for line in got)
    # leaving the block closed the connection mid-stream
    snap = wait_idle(server)
    assert snap.totals.requests_aborted == aborted + 1
    assert_blocks_free(server)


def test_disconnect_during_non_streaming_request_aborts(server) -> None:
    wait_idle(server)
    aborted = server.engine.snapshot().totals.requests_aborted
    timeout = httpx.Timeout(60.0, read=0.3)
    with (
        httpx.Client(base_url=server.url, timeout=timeout) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.post("/v1/completions", json=long_body(server, n=2))
    snap = wait_idle(server)
    assert snap.totals.requests_aborted == aborted + 1
    assert_blocks_free(server)


@pytest.fixture(scope="module")
def small_queue_server(tiny_llama: Path) -> Iterator[Server]:
    handle = start_server(engine_config(tiny_llama), ApiConfig(max_queue=2))
    yield handle
    handle.stop()


def test_bounded_queue_rejects_with_429(small_queue_server) -> None:
    server = small_queue_server
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        body = long_body(server, stream=True)
        with (
            client.stream("POST", "/v1/completions", json=body) as a,
            client.stream("POST", "/v1/completions", json=body) as b,
        ):
            assert a.status_code == b.status_code == 200
            r = client.post("/v1/completions", json={**body, "stream": False})
            assert r.status_code == 429
            err = r.json()["error"]
            assert err["type"] == "rate_limit_error" and "capacity" in err["message"]
        metrics = client.get("/metrics").text
        assert "radixcache_rejected_requests_total 1.0" in metrics
    wait_idle(server)
    with httpx.Client(base_url=server.url, timeout=60.0) as client:
        short = {**body, "stream": False, "max_tokens": 4}
        assert client.post("/v1/completions", json=short).status_code == 200
    assert_blocks_free(server)
