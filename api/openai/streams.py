"""Server-sent event streams for completions and chat (`data: {...}` ... `data: [DONE]`): the
choices of each output delta (choices.py), then usage if asked; a failure is an error event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from api.openai.choices import ChatChoices, CompletionChoices, usage_of
from api.openai.protocol import ChatCompletionChunk, CompletionResponse, Usage, dump
from api.serving.job_streams import RunningJobs, stream_outputs
from api.serving.sse import error_event, sse
from engine.outputs import RequestOutput, RequestResult


@dataclass(frozen=True)
class ResponseHead:
    """The fields every chunk of one response repeats."""

    request_id: str
    created: int
    model: str
    include_usage: bool


async def _chunk_events(
    running: RunningJobs,
    head: ResponseHead,
    chunk: Callable[[list[Any], Usage | None], str],
    chunks_of: Callable[[int, RequestOutput], list[list[Any]]],
) -> AsyncIterator[str]:
    """Runs the jobs: chunks for each output with news (each a list of choices), then usage (if
    asked) and `[DONE]`."""
    finals: list[RequestResult] = []
    try:
        async for job, out in stream_outputs(running, finals):
            for choices in chunks_of(job, out):
                yield chunk(choices, None)
    except Exception as exc:
        yield error_event(exc)
    else:
        if head.include_usage:
            yield chunk([], usage_of(finals))
    yield sse("[DONE]")


async def chat_events(
    running: RunningJobs, head: ResponseHead, choices: ChatChoices
) -> AsyncIterator[str]:
    def chunk(parts: list[Any], usage: Usage | None) -> str:
        body = ChatCompletionChunk(
            id=head.request_id, created=head.created, model=head.model, choices=parts, usage=usage
        )
        return sse(dump(body))

    yield chunk(choices.opening(), None)

    def chunks_of(_job: int, out: RequestOutput) -> list[list[Any]]:
        return choices.streamed(out)

    async with aclosing(_chunk_events(running, head, chunk, chunks_of)) as events:
        async for event in events:
            yield event


async def completion_events(
    running: RunningJobs, head: ResponseHead, choices: CompletionChoices
) -> AsyncIterator[str]:
    def chunk(parts: list[Any], usage: Usage | None) -> str:
        body = CompletionResponse(
            id=head.request_id, created=head.created, model=head.model, choices=parts, usage=usage
        )
        return sse(dump(body))

    def chunks_of(job: int, out: RequestOutput) -> list[list[Any]]:
        parts = choices.streamed(job, out)
        return [parts] if parts else []

    if choices.echo is not None:
        yield chunk(choices.echoed(), None)
    async with aclosing(_chunk_events(running, head, chunk, chunks_of)) as events:
        async for event in events:
            yield event
