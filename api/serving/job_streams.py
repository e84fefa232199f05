"""Drives one HTTP request's engine jobs: builds and admits them, merges their output streams,
observes latencies, tells the request's analytics once all finished, and aborts whatever is
unfinished when the consumer stops (client gone, error, cancellation)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import Request

from api.errors import ApiError
from api.observability.metrics import ApiMetrics
from api.serving.engine_errors import as_api_error
from api.serving.request_builder import GenerationSpec, build_jobs
from engine.outputs import RequestOutput, RequestResult

if TYPE_CHECKING:
    from api.auth import Caller
    from api.state import ServerState
    from engine.async_engine import AsyncEngine, RequestStream
    from engine.request import GenerateJob


@dataclass
class Timing:
    """TTFT and inter-token latency per sequence, observed as outputs reach the API."""

    metrics: ApiMetrics
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    _last: dict[tuple[int, int], float] = field(default_factory=dict)  # time of last tokens

    def observe(self, job: int, output: RequestOutput) -> None:
        now = time.perf_counter()
        for delta in output.outputs:
            new = len(delta.token_ids)
            if new == 0:
                continue
            key = (job, delta.index)
            if self.first_token is None:
                self.first_token = now
                self.metrics.observe_ttft(now - self.arrival)
            self.metrics.count_output(new)
            last = self._last.get(key)
            if last is not None:
                gap = (now - last) / new
                for _ in range(new):
                    self.metrics.itl.observe(gap)
            self._last[key] = now

    def finish(self) -> None:
        self.metrics.e2e.observe(time.perf_counter() - self.arrival)


Finished = Callable[[list[RequestResult]], None]


@dataclass
class RunningJobs:
    """One HTTP request's admitted jobs: their output streams, the latencies they show, and who
    is told every job's result once all finished (the request's own analytics)."""

    streams: list[RequestStream]
    timing: Timing
    on_finish: Finished | None = None


async def start_request(state: ServerState, spec: GenerationSpec, caller: Caller) -> RunningJobs:
    """The spec's jobs built and admitted, counted under its prompt_cache_key once finished."""
    jobs = await build_jobs(state, spec, caller)
    counted = state.prompt_cache_keys.recorder(caller, spec.prompt_cache_key)
    return open_jobs(state.engine, jobs, state.metrics, counted)


_DONE = object()


def open_jobs(
    engine: AsyncEngine,
    jobs: list[GenerateJob],
    metrics: ApiMetrics,
    on_finish: Finished | None = None,
) -> RunningJobs:
    """Admits every job or none, before any response starts (so a full queue is a 429)."""
    try:
        streams = engine.open_streams(jobs)
    except Exception as exc:
        err = as_api_error(exc)
        if isinstance(err, ApiError) and err.status == 429:
            metrics.rejected.inc()
        raise err from exc
    return RunningJobs(streams, Timing(metrics), on_finish)


async def _pump(index: int, stream: RequestStream, queue: asyncio.Queue) -> None:
    try:
        async for output in stream:
            queue.put_nowait((index, output))
        queue.put_nowait((index, _DONE))
    except Exception as exc:  # handed to the consumer, which re-raises it
        queue.put_nowait((index, exc))


async def run_jobs(running: RunningJobs) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Yields (job index, output delta) until every job finished; closing early aborts the rest."""
    streams = running.streams
    queue: asyncio.Queue = asyncio.Queue()
    tasks = [asyncio.create_task(_pump(i, s, queue)) for i, s in enumerate(streams)]
    pending = set(range(len(streams)))
    try:
        while pending:
            index, item = await queue.get()
            if item is _DONE:
                pending.discard(index)
            elif isinstance(item, Exception):
                raise as_api_error(item) from item
            else:
                running.timing.observe(index, item)
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        for stream in streams:
            await stream.aclose()


async def stream_outputs(
    running: RunningJobs, results: list[RequestResult]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Job output deltas as they come; `results` folds them (for a closing usage report)."""
    results[:] = [RequestResult(s.request_id) for s in running.streams]
    async for index, out in run_jobs(running):
        results[index].add(out)
        yield index, out
    running.timing.finish()
    if running.on_finish is not None:
        running.on_finish(results)


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


class ClientDisconnected(Exception):
    pass


async def collect_final(running: RunningJobs, request: Request) -> list[RequestResult]:
    """Every job's whole result; aborts them all if the client disconnects first."""

    async def collect() -> list[RequestResult]:
        results: list[RequestResult] = []
        async for _ in stream_outputs(running, results):
            pass
        return results

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
