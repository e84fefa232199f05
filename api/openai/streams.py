"""Server-sent event streams for completions and chat (`data: {...}` ... `data: [DONE]`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, error_json
from api.openai.logprobs import (
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    raise_if_failed,
    sse,
    usage_of,
)
from api.openai.protocol import (
    ChatChunkChoice,
    ChatCompletionChunk,
    CompletionChoice,
    CompletionResponse,
    Delta,
    dump,
)
from api.openai.tool_stream import ToolStream
from api.serving.job_streams import Timing, run_jobs
from engine.outputs import CompletionDelta, RequestOutput, RequestResult

if TYPE_CHECKING:
    from api.openai.tool_plan import ToolPlan
    from engine.async_engine import RequestStream


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
    streams: list[RequestStream]
    timing: Timing
    request_id: str
    created: int
    model: str
    n: int
    include_usage: bool
    logprobs: bool
    token_ids: bool = False  # extension: send each chunk's new token ids
    echo: list[str] | None = None  # completions: per-job prompt text to send first
    tools: ToolPlan | None = None  # chat with tools: how calls are read out of the text

    @property
    def per_token(self) -> bool:
        """Chunks carry per-token data, so token-only (textless) progress is sent too."""
        return self.logprobs or self.token_ids


def _error_event(exc: Exception) -> str:
    if isinstance(exc, ApiError):
        return sse(error_json(exc.status, exc.message, exc.param, exc.code))
    return sse(error_json(500, f"Generation failed: {type(exc).__name__}: {exc}"))


async def _outputs(
    ctx: StreamContext, results: list[RequestResult]
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Job output deltas as they come; `results` folds them (for the usage chunk)."""
    results[:] = [RequestResult(s.request_id) for s in ctx.streams]
    async for index, out in run_jobs(ctx.streams, ctx.timing):
        results[index].add(out)
        yield index, out
    ctx.timing.finish()


def _has_news(ctx: StreamContext, delta: CompletionDelta) -> bool:
    return bool(delta.text) or delta.finished or (bool(delta.token_ids) and ctx.per_token)


async def _delta_events(
    ctx: StreamContext,
    chunk: Callable[..., str],
    chunks_of: Callable[[int, RequestOutput], list[list[Any]]],
) -> AsyncIterator[str]:
    """Runs the jobs: chunks for each output with news (each a list of choices), then usage (if
    asked) and `[DONE]`."""
    finals: list[RequestResult] = []
    try:
        async for job, out in _outputs(ctx, finals):
            for choices in chunks_of(job, out):
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

    plan = ctx.tools
    splits: dict[int, ToolStream] = {}

    def plain(d: CompletionDelta) -> list[list[ChatChunkChoice]]:
        choice = ChatChunkChoice(
            index=d.index,
            delta=Delta(content=d.text),
            logprobs=chat_logprobs(tokenizer, d) if ctx.logprobs else None,
            finish_reason=finish_reason(d.finish_reason),
            token_ids=d.token_ids if ctx.token_ids else None,
        )
        return [[choice]]

    def with_tools(d: CompletionDelta, parser: Any) -> list[list[ChatChunkChoice]]:
        split = splits.setdefault(d.index, ToolStream(parser, plan.parallel))
        content, calls = split.feed(d.text, final=d.finished)
        chunks = []
        if content or (ctx.per_token and d.token_ids):
            lp = chat_logprobs(tokenizer, d) if ctx.logprobs else None
            ids = d.token_ids if ctx.token_ids else None
            chunks.append(
                [
                    ChatChunkChoice(
                        index=d.index, delta=Delta(content=content), logprobs=lp, token_ids=ids
                    )
                ]
            )
        for part in calls:
            chunks.append([ChatChunkChoice(index=d.index, delta=Delta(tool_calls=[part]))])
        if d.finished:
            reason = finish_reason(d.finish_reason, bool(split.calls))
            chunks.append([ChatChunkChoice(index=d.index, delta=Delta(), finish_reason=reason)])
        return chunks

    def choices_of(_job: int, out: RequestOutput) -> list[list[ChatChunkChoice]]:
        chunks: list[list[ChatChunkChoice]] = []
        for d in out.outputs:
            raise_if_failed(d)
            if plan is not None and plan.parser is not None:
                chunks += with_tools(d, plan.parser)
            elif _has_news(ctx, d):
                chunks += plain(d)
        return chunks

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

    text_sent: dict[int, int] = {}  # characters sent per choice (logprob text offsets)

    def choices_of(job: int, out: RequestOutput) -> list[list[CompletionChoice]]:
        choices = []
        for d in out.outputs:
            raise_if_failed(d)
            if not _has_news(ctx, d):
                continue
            key = job * ctx.n + d.index
            text_start = text_sent.get(key, 0)
            text_sent[key] = text_start + len(d.text)
            lp = completion_logprobs(tokenizer, d, text_start) if ctx.logprobs else None
            choices.append(
                CompletionChoice(
                    index=key,
                    text=d.text,
                    logprobs=lp,
                    finish_reason=finish_reason(d.finish_reason),
                    token_ids=d.token_ids if ctx.token_ids else None,
                )
            )
        return [choices] if choices else []

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
