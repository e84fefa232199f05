"""A streamed response as OpenAI sends it (`event:` and `data:` lines, each event numbered):
response.created, response.in_progress, then per output item output_item.added, its
content_part.added and output_text.delta ... (a message) or function_call_arguments.delta ... (a
call), their done events and output_item.done, then response.completed (or response.incomplete).
A failure is an `error` event then response.failed: the stream always ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from api.errors import ApiError
from api.openai.responses.answer import Answer
from api.openai.responses.objects import FunctionCallOutput, MessageOutput
from api.openai.responses.output import (
    ArgumentsDelta,
    Closed,
    Event,
    Opened,
    OutputWriter,
    TextDelta,
)
from api.serving.engine_errors import raise_if_failed
from api.serving.job_streams import RunningJobs, stream_outputs
from engine.outputs import RequestResult

Finish = Callable[[dict[str, Any], RequestResult], Awaitable[None]]


@dataclass
class EventWriter:
    sequence: int = 0

    def __call__(self, kind: str, **fields: Any) -> str:
        data = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


async def response_events(
    running: RunningJobs, answer: Answer, writer: OutputWriter, finish: Finish
) -> AsyncIterator[str]:
    """Runs the job; `finish(body, result)` (the store's write) before the closing event."""
    event = EventWriter()
    yield event("response.created", response=answer.in_progress())
    yield event("response.in_progress", response=answer.in_progress())
    results: list[RequestResult] = []
    try:
        async for _, out in stream_outputs(running, results):
            for d in out.outputs:
                raise_if_failed(d)
                cut = d.finish_reason == "length"
                for e in writer.feed(d.text, d.finished, cut):
                    for line in _item_events(event, e):
                        yield line
        body = answer.finished(writer.items, results[0])
        await finish(body, results[0])
    except Exception as exc:
        err = exc if isinstance(exc, ApiError) else ApiError(500, f"Generation failed: {exc}")
        code = err.code or "server_error"
        yield event("error", code=code, message=err.message, param=err.param)
        yield event("response.failed", response=answer.failed(writer.items, code, err.message))
        return
    closing = "response.completed" if body["status"] == "completed" else "response.incomplete"
    yield event(closing, response=body)


def _item_events(event: EventWriter, e: Event) -> list[str]:
    if isinstance(e, Opened):
        added = [event("response.output_item.added", output_index=e.index, item=_dump(e.item))]
        if isinstance(e.item, MessageOutput):
            part = _dump(e.item.content[0])
            added.append(event("response.content_part.added", **_at(e), part=part))
        return added
    if isinstance(e, TextDelta):
        return [event("response.output_text.delta", **_at(e), delta=e.text, logprobs=[])]
    if isinstance(e, ArgumentsDelta):
        return [
            event(
                "response.function_call_arguments.delta",
                output_index=e.index,
                item_id=e.item_id,
                delta=e.text,
            )
        ]
    return _closed(event, e)


def _closed(event: EventWriter, e: Closed) -> list[str]:
    item = e.item
    lines = []
    if isinstance(item, MessageOutput):
        part = item.content[0]
        lines.append(event("response.output_text.done", **_at(e), text=part.text, logprobs=[]))
        lines.append(event("response.content_part.done", **_at(e), part=_dump(part)))
    elif isinstance(item, FunctionCallOutput):
        lines.append(
            event(
                "response.function_call_arguments.done",
                output_index=e.index,
                item_id=item.id,
                name=item.name,
                arguments=item.arguments,
            )
        )
    lines.append(event("response.output_item.done", output_index=e.index, item=_dump(item)))
    return lines


def _at(e: Opened | TextDelta | Closed) -> dict[str, Any]:
    item_id = e.item_id if isinstance(e, TextDelta) else e.item.id
    return dict(output_index=e.index, item_id=item_id, content_index=0)


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json")
