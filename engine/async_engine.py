"""Async front: the engine loop runs on its own thread; each request gets a RequestStream.

Everything that touches engine state (add, abort, step, cache analytics) runs on the engine thread;
callers hand it typed commands through a queue and results come back through futures or streams.
The one in-flight limit lives here: `open_streams` refuses work beyond `max_in_flight`."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from engine.config import EngineConfig
from engine.kv.admin import AdminOp, CheckIntegrity
from engine.kv.events import ZmqEventPublisher
from engine.llm_engine import LLMEngine
from engine.openmp import release_thread_pool
from engine.outputs import RequestOutput
from engine.request import GenerateJob, Prompt
from engine.sampling_params import SamplingParams
from engine.stats import EngineSnapshot
from engine.structured.constraints import Constraint
from radixcache.integrity import IntegrityError

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineOverloaded(RuntimeError):
    """The bounded in-flight queue is full; retry later (HTTP 429)."""


class EngineDead(RuntimeError):
    """The engine loop stopped (shutdown or a fatal error)."""


# --- commands for the engine thread ---
@dataclass(frozen=True)
class AddRequest:
    job: GenerateJob


@dataclass(frozen=True)
class AbortRequest:
    request_id: str


@dataclass(frozen=True)
class EngineCall:
    """Runs `fn(engine, *args)` on the engine thread and resolves `future` with the result."""

    fn: Callable[..., Any]
    args: tuple[Any, ...]
    future: Future = field(default_factory=Future)


@dataclass(frozen=True)
class Shutdown:
    pass


Command = AddRequest | AbortRequest | EngineCall | Shutdown


class RequestStream:
    """One request's output deltas as they arrive. Closing it before the end aborts the request."""

    def __init__(self, engine: AsyncEngine, request_id: str) -> None:
        self.request_id = request_id
        self.finished = False
        self._engine = engine
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> bool:
        """Called on the engine thread; False when the consumer's event loop is gone."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            return False
        return True

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:  # cancelled while waiting: the consumer is gone
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        self.finished = item.finished
        return item

    async def aclose(self) -> None:
        if not self.finished:
            self.finished = True
            self._engine.abort(self.request_id)


class AsyncEngine:
    def __init__(
        self,
        config: EngineConfig,
        engine: LLMEngine | None = None,
        max_in_flight: int | None = None,
    ) -> None:
        """Requests in flight (running or waiting) are capped at what the engine can hold,
        max_num_seqs + max_waiting_requests, or at `max_in_flight` when that is lower."""
        self.config = config
        self.engine = engine if engine is not None else LLMEngine(config)
        cap = config.max_num_seqs + config.max_waiting_requests
        self.max_in_flight = cap if max_in_flight is None else min(max_in_flight, cap)
        self._inbox: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._streams: dict[str, RequestStream] = {}
        self._lock = threading.Lock()  # guards _streams (event loop threads and engine thread)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # --- identity ---
    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def model_name(self) -> str:
        return self.engine.model_name

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def kv_dtype(self) -> str:
        return self.engine.namespace.kv_dtype

    @property
    def kv_events(self) -> ZmqEventPublisher | None:
        """The KV-events publisher (its counters are thread-safe reads), None when off."""
        return self.engine.kv.publisher

    @property
    def can_retain(self) -> bool:
        """Whether a prompt's prefix can be retained (a persistent tier: disk or Redis)."""
        return self.engine.kv.can_retain

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.engine.model.parameters())

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    # --- lifecycle ---
    def start(self) -> None:
        """Starts the engine loop. Call it on the thread that built the engine: that thread's
        OpenMP workers are freed, as all of the engine's compute moves to the loop's thread."""
        if self._thread is None:
            release_thread_pool()
            self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._inbox.put(Shutdown())
            self._thread.join()
            self._thread = None
        self.engine.close()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- requests (call from an event loop) ---
    def open_streams(self, jobs: list[GenerateJob]) -> list[RequestStream]:
        """Admits all jobs or none: raises EngineDead, RequestTooLarge (the KV pool cannot hold
        one), EngineOverloaded, ValueError (a duplicate id), in that order. The jobs' input was
        checked by the caller (the API refuses bad requests before)."""
        if not self.is_running:
            raise EngineDead("the engine is not running") from self._error
        for job in jobs:
            self.engine.check_request(job.prompt, job.params)
        with self._lock:
            if len(self._streams) + len(jobs) > self.max_in_flight:
                raise EngineOverloaded(
                    f"{len(self._streams)} requests in flight (limit {self.max_in_flight})"
                )
            ids = [job.request_id for job in jobs]
            if len(set(ids)) < len(ids) or any(i in self._streams for i in ids):
                raise ValueError(f"duplicate request id among {ids!r}")
            streams = [RequestStream(self, i) for i in ids]
            self._streams.update(zip(ids, streams, strict=True))
        for job in jobs:
            self._inbox.put(AddRequest(job))
        return streams

    def generate(
        self, prompt: Prompt, params: SamplingParams, request_id: str, cache_salt: str = ""
    ) -> RequestStream:
        """Output deltas as tokens arrive; the last one is finished."""
        return self.open_streams([GenerateJob(request_id, prompt, params, cache_salt)])[0]

    def abort(self, request_id: str) -> None:
        self._inbox.put(AbortRequest(request_id))

    async def prepare_constraints(self, constraints: list[Constraint]) -> None:
        """Compiles each constraint into the engine's grammar cache, on worker threads (not the
        event loop, not the engine thread); raises ConstraintError for a bad or unsupported one.
        Await it before open_streams: the request then finds its grammar compiled."""
        unique = list(dict.fromkeys(constraints))
        await asyncio.gather(*(asyncio.to_thread(self.engine.grammars.compile, c) for c in unique))

    # --- analytics and administration (blocking: call off the event loop) ---
    def snapshot(self) -> EngineSnapshot:
        return self._call(LLMEngine.snapshot)

    def admin(self, op: AdminOp[T]) -> T:
        """A cache administration operation (engine.kv.admin), run on the engine thread."""
        return self._call(LLMEngine.admin, op)

    def integrity_error(self) -> str | None:
        """check_integrity's finding as text, None when every invariant holds."""
        try:
            self.admin(CheckIntegrity())
        except IntegrityError as exc:
            return str(exc)
        return None

    def has_unfinished(self) -> bool:
        return self._call(LLMEngine.has_unfinished)

    def _call(self, fn: Callable[..., T], *args: Any) -> T:
        """fn(engine, *args) on the engine thread (or here, when the loop is not running); it
        runs after every command queued before it."""
        if not self.is_running or threading.current_thread() is self._thread:
            return fn(self.engine, *args)
        call = EngineCall(fn, args)
        self._inbox.put(call)
        return call.future.result()

    # --- the loop (engine thread) ---
    def _loop(self) -> None:
        try:
            while self._drain(block=not self.engine.has_unfinished()):
                if self.engine.has_unfinished():
                    for out in self.engine.step():
                        self._deliver(out)
        except BaseException as exc:  # fail every open stream instead of hanging them
            log.exception("engine loop died")
            self._error = exc
            with self._lock:
                streams, self._streams = self._streams, {}
            for stream in streams.values():
                stream.put(EngineDead(f"engine loop died: {exc!r}"))

    def _drain(self, block: bool) -> bool:
        """Applies queued commands; False on shutdown."""
        while True:
            try:
                cmd = self._inbox.get(block=block)
            except queue.Empty:
                return True
            block = False
            if isinstance(cmd, Shutdown):
                self._abort_all()
                return False
            self._apply(cmd)

    def _apply(self, cmd: Command) -> None:
        match cmd:
            case AddRequest(job):
                try:
                    self.engine.add_request(
                        job.request_id,
                        job.prompt,
                        job.params,
                        job.cache_salt,
                        retain_prefix=job.retain_prefix,
                    )
                except Exception as exc:
                    self._fail(job.request_id, exc)
            case AbortRequest(request_id):
                out = self.engine.abort(request_id)
                if out is not None:
                    self._deliver(out)
            case EngineCall(fn, args, future):
                try:
                    future.set_result(fn(self.engine, *args))
                except Exception as exc:
                    future.set_exception(exc)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
            if stream is not None and out.finished:
                del self._streams[out.request_id]
        if stream is not None and not stream.put(out) and not out.finished:
            self.engine.abort(out.request_id)  # nobody reads it any more
            with self._lock:
                self._streams.pop(out.request_id, None)

    def _fail(self, request_id: str, exc: BaseException) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
        if stream is not None:
            stream.put(exc)

    def _abort_all(self) -> None:
        for request_id in list(self.engine.requests):
            out = self.engine.abort(request_id)
            if out is not None:
                self._deliver(out)
