"""Server-sent event streams for completions and chat (`data: {...}` ... `data: [DONE]`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, error_json
from api.generation import Job, Timing, run_jobs
from api.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    Delta,
    dump,
)
from api.responses import (
    DeltaTracker,
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    sse,
    usage_of,
)


class EventStream(StreamingResponse):
    """An SSE response that runs `on_close` however it ends (done, error, client gone)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            self._on_close()


@dataclass
class StreamContext:
    engine: Any
    jobs: list[Job]
    timing: Timing
    request_id: str
    created: int
    model: str
    n: int
    include_usage: bool
    logprobs: bool
    token_ids: bool = False  # extension: send each chunk's new token ids
    echo: list[str] | None = None  # completions: per-job prompt text to send first

    @property
    def per_token(self) -> bool:
        """Chunks carry per-token data, so token-only (textless) progress is sent too."""
        return self.logprobs or self.token_ids


def _error_event(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        return sse(error_json(exc.status, exc.message, exc.param, exc.code))
    return sse(error_json(500, f"Generation failed: {type(exc).__name__}: {exc}"))


async def _outputs(ctx: StreamContext, finals: list[Any]) -> AsyncIterator[tuple[int, Any]]:
    """Job outputs as they come; `finals` keeps the latest output of every job."""
    finals[:] = [None] * len(ctx.jobs)
    async for index, out in run_jobs(ctx.engine, ctx.jobs, ctx.timing):
        finals[index] = out
        yield index, out
    ctx.timing.finish()


def _has_news(ctx: StreamContext, text: str, start: int, end: int, done: bool) -> bool:
    return bool(text) or done or (end > start and ctx.per_token)


async def _delta_events(
    ctx: StreamContext,
    chunk: Callable[..., str],
    choices_of: Callable[[int, Any], list[Any]],
) -> AsyncIterator[str]:
    """Runs the jobs: a chunk per output with news, then usage (if asked) and `[DONE]`."""
    finals: list[Any] = []
    try:
        async for job, out in _outputs(ctx, finals):
            choices = choices_of(job, out)
            if choices:
                yield chunk(choices)
    except Exception as exc:
        yield _error_event(exc)
    else:
        if ctx.include_usage:
            yield chunk([], usage_of(finals))
    yield sse("[DONE]")


async def chat_events(ctx: StreamContext, tokenizer: Any) -> AsyncIterator[str]:
    def chunk(choices: list[ChatChunkChoice], usage: Any = None) -> str:
        body = ChatCompletionChunk(
            id=ctx.request_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage
        )
        return sse(dump(body))

    tracker = DeltaTracker()

    def choices_of(_job: int, out: Any) -> list[ChatChunkChoice]:
        choices = []
        for c in out.outputs:
            text, start, end, done = tracker.advance(c.index, c)
            if not _has_news(ctx, text, start, end, done):
                continue
            choices.append(
                ChatChunkChoice(
                    index=c.index,
                    delta=Delta(content=text),
                    logprobs=chat_logprobs(tokenizer, c, start, end) if ctx.logprobs else None,
                    finish_reason=finish_reason(c.finish_reason) if done else None,
                    token_ids=c.token_ids[start:end] if ctx.token_ids else None,
                )
            )
        return choices

    yield chunk(
        [ChatChunkChoice(index=i, delta=Delta(role="assistant", content="")) for i in range(ctx.n)]
    )
    async with aclosing(_delta_events(ctx, chunk, choices_of)) as events:
        async for event in events:
            yield event


async def completion_events(ctx: StreamContext, tokenizer: Any) -> AsyncIterator[str]:
    def chunk(choices: list[CompletionChoice], usage: Any = None) -> str:
        body = CompletionResponse(
            id=ctx.request_id, created=ctx.created, model=ctx.model, choices=choices, usage=usage
        )
        return sse(dump(body))

    tracker = DeltaTracker()

    def choices_of(job: int, out: Any) -> list[CompletionChoice]:
        choices = []
        for c in out.outputs:
            key = job * ctx.n + c.index
            text_start = tracker.text.get(key, 0)
            text, start, end, done = tracker.advance(key, c)
            if not _has_news(ctx, text, start, end, done):
                continue
            lp = completion_logprobs(tokenizer, c, start, end, text_start) if ctx.logprobs else None
            choices.append(
                CompletionChoice(
                    index=key,
                    text=text,
                    logprobs=lp,
                    finish_reason=finish_reason(c.finish_reason) if done else None,
                    token_ids=c.token_ids[start:end] if ctx.token_ids else None,
                )
            )
        return choices

    if ctx.echo is not None:
        yield chunk(
            [
                CompletionChoice(index=j * ctx.n + i, text=text)
                for j, text in enumerate(ctx.echo)
                for i in range(ctx.n)
            ]
        )
    async with aclosing(_delta_events(ctx, chunk, choices_of)) as events:
        async for event in events:
            yield event
