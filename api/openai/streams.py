"""Server-sent event streams for completions and chat (`data: {...}` ... `data: [DONE]`): the
choices of each output delta (choices.py), then usage if asked; a failure is an error event."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
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


Body = type[ChatCompletionChunk] | type[CompletionResponse]
ChunksOf = Callable[[int, RequestOutput], list[list[Any]]]


async def _events(
    running: RunningJobs, head: ResponseHead, body: Body, opening: list[Any], chunks_of: ChunksOf
) -> AsyncIterator[str]:
    """Runs the jobs: `opening` (if any choices), then a chunk per list of choices each output
    gives, then usage (if asked) and `[DONE]`; a failure is an error event before `[DONE]`."""

    def chunk(choices: list[Any], usage: Usage | None = None) -> str:
        fields = dict(id=head.request_id, created=head.created, model=head.model)
        return sse(dump(body(**fields, choices=choices, usage=usage)))

    if opening:
        yield chunk(opening)
    finals: list[RequestResult] = []
    try:
        async for job, out in stream_outputs(running, finals):
            for choices in chunks_of(job, out):
                yield chunk(choices)
    except Exception as exc:
        yield error_event(exc)
    else:
        if head.include_usage:
            yield chunk([], usage_of(finals))
    yield sse("[DONE]")


def chat_events(
    running: RunningJobs, head: ResponseHead, choices: ChatChoices
) -> AsyncIterator[str]:
    def chunks_of(_job: int, out: RequestOutput) -> list[list[Any]]:
        return choices.streamed(out)

    return _events(running, head, ChatCompletionChunk, choices.opening(), chunks_of)


def completion_events(
    running: RunningJobs, head: ResponseHead, choices: CompletionChoices
) -> AsyncIterator[str]:
    def chunks_of(job: int, out: RequestOutput) -> list[list[Any]]:
        parts = choices.streamed(job, out)
        return [parts] if parts else []

    opening = choices.echoed() if choices.echo is not None else []
    return _events(running, head, CompletionResponse, opening, chunks_of)
