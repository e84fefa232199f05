"""Async front: the engine loop runs on its own thread; each request gets an asyncio stream.

Everything that touches engine state (add, abort, step, cache analytics) runs on the engine thread;
callers hand it commands through a queue and results come back through futures or streams."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.outputs import RequestOutput
from engine.sampling import SamplingParams

log = logging.getLogger(__name__)
T = TypeVar("T")
_STOP = object()


class EngineOverloaded(RuntimeError):
    """The bounded waiting queue is full; retry later (HTTP 429/503)."""


class EngineDead(RuntimeError):
    """The engine loop stopped (shutdown or a fatal error)."""


class _Stream:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

    def put(self, item: RequestOutput | BaseException) -> bool:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the consumer's event loop is closed: nobody will read this
            return False
        return True


class AsyncEngine:
    def __init__(self, config: EngineConfig, engine: LLMEngine | None = None) -> None:
        self.config = config
        self.engine = engine if engine is not None else LLMEngine(config)
        self._inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}
        self._in_flight = 0
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.max_in_flight = config.max_num_seqs + config.max_waiting_requests

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

    def check_fits(self, num_prompt_tokens: int, max_tokens: int) -> None:
        """Raises RequestTooLarge when the request alone can never fit (reads constants only)."""
        self.engine.scheduler.check_fits(num_prompt_tokens, max_tokens)

    # --- lifecycle ---
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="engine-loop", daemon=True)
            self._thread.start()

    def shutdown(self) -> None:
        if self._thread is not None:
            self._inbox.put(_STOP)
            self._thread.join()
            self._thread = None
        self.engine.close()

    @property
    def is_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # --- requests ---
    async def generate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        request_id: str,
        cache_salt: str = "",
    ) -> AsyncIterator[RequestOutput]:
        """Cumulative outputs as tokens arrive; the last one is finished."""
        if not self.is_running:
            raise EngineDead("the engine is not running") from self._error
        tokens = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise ValueError("the prompt is empty")
        self.engine.scheduler.check_fits(len(tokens), params.max_tokens)
        with self._lock:
            if self._in_flight >= self.max_in_flight:
                raise EngineOverloaded(f"{self._in_flight} requests in flight; try again later")
            if request_id in self._streams:
                raise ValueError(f"duplicate request id {request_id!r}")
            self._in_flight += 1
            stream = _Stream(asyncio.get_running_loop())
            self._streams[request_id] = stream
        text = prompt if isinstance(prompt, str) else None
        self._inbox.put(("add", request_id, text, tokens, params, cache_salt))
        finished = False
        try:
            while not finished:
                item = await stream.queue.get()
                while not stream.queue.empty() and not isinstance(item, BaseException):
                    if item.finished:
                        break
                    item = stream.queue.get_nowait()  # cumulative: the newest supersedes
                if isinstance(item, BaseException):
                    finished = True
                    raise item
                finished = item.finished
                yield item
        finally:
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    # --- calls run on the engine thread ---
    def call(self, fn: Callable[[LLMEngine], T]) -> T:
        """Runs fn(engine) on the engine thread (or here, when the loop is not running)."""
        if not self.is_running or threading.current_thread() is self._thread:
            return fn(self.engine)
        future: Future[T] = Future()
        self._inbox.put(("call", fn, future))
        return future.result()

    def stats(self) -> dict[str, Any]:
        return self.call(lambda e: e.stats_snapshot())

    def cache_stats(self) -> Any:
        return self.call(lambda e: e.prefix_cache.stats())

    def lookup(self, token_ids: list[int], cache_salt: str = "") -> dict[str, int]:
        return self.call(lambda e: e.lookup(token_ids, cache_salt))

    def flush(self, cache_salt: str | None = None) -> int:
        return self.call(lambda e: e.flush(cache_salt))

    def pin(self, token_ids: list[int], cache_salt: str = "") -> int:
        return self.call(lambda e: e.prefix_cache.pin(e.namespace_for(cache_salt), token_ids))

    def unpin(self, token_ids: list[int], cache_salt: str = "") -> int:
        return self.call(lambda e: e.prefix_cache.unpin(e.namespace_for(cache_salt), token_ids))

    def hottest_prefixes(self, limit: int = 10, cache_salt: str | None = None) -> list[Any]:
        return self.call(lambda e: e.hottest_prefixes(limit, cache_salt))

    def check_integrity(self) -> None:
        self.call(lambda e: e.prefix_cache.check_integrity())

    # --- the loop ---
    def _loop(self) -> None:
        try:
            while True:
                if not self._drain(block=not self.engine.has_unfinished()):
                    return
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
            if cmd is _STOP:
                self._abort_all()
                return False
            self._apply(cmd)

    def _apply(self, cmd: tuple) -> None:
        kind = cmd[0]
        if kind == "add":
            _, request_id, text, tokens, params, salt = cmd
            try:
                self.engine.add_request(request_id, tokens, params, salt, prompt_text=text)
            except Exception as exc:
                self._fail(request_id, exc)
        elif kind == "abort":
            out = self.engine.abort(cmd[1])
            if out is not None:
                self._deliver(out)
        elif kind == "call":
            _, fn, future = cmd
            try:
                future.set_result(fn(self.engine))
            except Exception as exc:
                future.set_exception(exc)

    def _deliver(self, out: RequestOutput) -> None:
        with self._lock:
            stream = self._streams.get(out.request_id)
            if stream is not None and out.finished:
                del self._streams[out.request_id]
                self._in_flight -= 1
        if stream is not None and not stream.put(out) and not out.finished:
            self.engine.abort(out.request_id)
            with self._lock:
                if self._streams.pop(out.request_id, None) is not None:
                    self._in_flight -= 1

    def _fail(self, request_id: str, exc: BaseException) -> None:
        with self._lock:
            stream = self._streams.pop(request_id, None)
            if stream is not None:
                self._in_flight -= 1
        if stream is not None:
            stream.put(exc)

    def _abort_all(self) -> None:
        for request_id in list(self.engine.requests):
            out = self.engine.abort(request_id)
            if out is not None:
                self._deliver(out)
