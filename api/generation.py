"""Drives one HTTP request's engine jobs: merges their output streams, observes latencies, and
aborts whatever is unfinished when the consumer stops (client gone, error, cancellation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from api.errors import ApiError
from api.metrics import ApiMetrics


@dataclass
class Job:
    request_id: str
    prompt: str | list[int]
    prompt_ids: list[int]
    params: Any  # engine.sampling.SamplingParams
    cache_salt: str


@dataclass
class Timing:
    """TTFT and inter-token latency per sequence, observed as outputs reach the API."""

    metrics: ApiMetrics
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    _last: dict[tuple[int, int], tuple[float, int]] = field(default_factory=dict)

    def observe(self, job: int, output: Any) -> None:
        now = time.perf_counter()
        for choice in output.outputs:
            key = (job, choice.index)
            count = len(choice.token_ids)
            last_time, last_count = self._last.get(key, (self.arrival, 0))
            if count <= last_count:
                continue
            if self.first_token is None:
                self.first_token = now
                self.metrics.ttft.observe(now - self.arrival)
            self.metrics.count_output(count - last_count)
            if last_count > 0:
                gap = (now - last_time) / (count - last_count)
                for _ in range(count - last_count):
                    self.metrics.itl.observe(gap)
            self._last[key] = (now, count)

    def finish(self) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)


_DONE = object()


def as_api_error(exc: Exception) -> Exception:
    """Engine exceptions -> HTTP errors (request too large: 400, overloaded: 429, dead: 503)."""
    from engine.async_engine import EngineDead, EngineOverloaded

    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, EngineOverloaded):
        return ApiError(429, f"Server is at capacity: {exc}", code="queue_full")
    if isinstance(exc, EngineDead):
        return ApiError(503, f"The engine is unavailable: {exc}", code="engine_unavailable")
    if isinstance(exc, ValueError):
        return ApiError(400, str(exc), code="invalid_request")
    return exc


async def _pump(engine: Any, index: int, job: Job, queue: asyncio.Queue) -> None:
    try:
        stream = engine.generate(job.prompt, job.params, job.request_id, cache_salt=job.cache_salt)
        async for output in stream:
            queue.put_nowait((index, output))
        queue.put_nowait((index, _DONE))
    except Exception as exc:  # handed to the consumer, which re-raises it
        queue.put_nowait((index, exc))


async def run_jobs(engine: Any, jobs: list[Job], timing: Timing) -> AsyncIterator[tuple[int, Any]]:
    """Yields (job index, cumulative RequestOutput) until every job finished."""
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(engine, i, job, queue)) for i, job in enumerate(jobs)]
    pending = set(range(len(jobs)))
    try:
        while pending:
            index, item = await queue.get()
            if item is _DONE:
                pending.discard(index)
            elif isinstance(item, Exception):
                raise as_api_error(item) from item
            else:
                timing.observe(index, item)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for index in pending:
            engine.abort(jobs[index].request_id)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientDisconnected(Exception):
    pass


async def collect_final(
    engine: Any, jobs: list[Job], timing: Timing, request: Request
) -> list[Any]:
    """The final output of every job; aborts them all if the client disconnects first."""

    async def collect() -> list[Any]:
        finals: list[Any] = [None] * len(jobs)
        async for index, output in run_jobs(engine, jobs, timing):
            finals[index] = output
        return finals

    work = asyncio.create_task(collect())
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
    if work.cancelled():
        raise ClientDisconnected
    return work.result()
