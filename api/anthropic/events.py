"""Anthropic's message stream (`event: <type>` + `data: <json>`): message_start (the message with
no content yet and the prompt's usage, once the prompt is computed), ping, per block
content_block_start / content_block_delta (text_delta, input_json_delta) / content_block_stop,
then message_delta (stop_reason, stop_sequence, usage) and message_stop. A failure is an
`event: error` and the stream ends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from api.anthropic.content import Reply, ending, sample_of, tool_use_id
from api.anthropic.errors import as_error, error_body
from api.openai.tool_plan import ToolPlan
from api.openai.tool_stream import ToolStream
from api.serving.engine_errors import raise_if_failed
from api.serving.job_streams import RunningJobs, stream_outputs
from engine.outputs import CompletionDelta, RequestResult

Settle = Callable[[list[RequestResult]], Awaitable[None]]


def event(kind: str, data: dict[str, Any]) -> str:
    return f"event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def error_event(exc: Exception) -> str:
    err = as_error(exc)
    return event("error", error_body(err.status, err.message))


@dataclass
class BlockStream:
    """One sample's deltas -> content block events, the blocks opened and closed in order: text
    (with tools, opened once it holds more than whitespace), then a tool_use block per call (its
    input streamed as the call's argument fragments)."""

    plan: ToolPlan | None
    index: int = -1  # of the open (or last) block
    kind: str | None = None  # of the open block
    _pending: str = ""  # leading whitespace, not yet a block
    _split: ToolStream | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.plan is not None and self.plan.parser is not None:
            self._split = ToolStream(self.plan.parser, self.plan.parallel)

    @property
    def called(self) -> bool:
        return self._split is not None and bool(self._split.calls)

    def feed(self, d: CompletionDelta) -> list[str]:
        if self._split is None:
            return self._text(d.text)
        content, calls = self._split.feed(d.text, d.finished, cut=d.finish_reason == "length")
        out = self._text(content)
        for part in calls:
            if part.id is not None:  # a call's first delta: its name
                block = {"type": "tool_use", "id": tool_use_id(), "name": part.function.name}
                out += self._open("tool_use", {**block, "input": {}})
            if part.function.arguments:
                out.append(
                    self._delta(
                        {"type": "input_json_delta", "partial_json": part.function.arguments}
                    )
                )
        return out

    def close(self) -> list[str]:
        if self.kind is None:
            return []
        self.kind = None
        return [event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _text(self, text: str) -> list[str]:
        if not text:
            return []
        out: list[str] = []
        if self.kind != "text":
            text, self._pending = self._pending + text, ""
            if not text.strip() and self._split is not None:  # as whole answers drop it
                self._pending = text
                return []
            out = self._open("text", {"type": "text", "text": ""})
        return [*out, self._delta({"type": "text_delta", "text": text})]

    def _open(self, kind: str, block: dict[str, Any]) -> list[str]:
        out = self.close()
        self.index += 1
        self.kind = kind
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*out, event("content_block_start", start)]

    def _delta(self, delta: dict[str, Any]) -> str:
        body = {"type": "content_block_delta", "index": self.index, "delta": delta}
        return event("content_block_delta", body)


async def message_events(running: RunningJobs, reply: Reply, settle: Settle) -> AsyncIterator[str]:
    """The stream of one request's message; `settle(results)` runs once its job finished, before
    message_delta (the route pins the breakpoints' prefixes there)."""
    results: list[RequestResult] = []
    blocks = BlockStream(reply.plan)
    started = False
    try:
        async for _, out in stream_outputs(running, results):
            if not started:
                started = True
                yield event("message_start", _start(reply, results[0]))
                yield event("ping", {"type": "ping"})
            for d in out.outputs:
                raise_if_failed(d)
                for e in blocks.feed(d):
                    yield e
        for e in blocks.close():
            yield e
        await settle(results)
        result = results[0]
        sample = sample_of(result)
        end = ending(sample, blocks.called, reply.stops, reply.tokenizer)
        delta = {"stop_reason": end.stop_reason, "stop_sequence": end.stop_sequence}
        usage = reply.usage(result, len(sample.token_ids)).model_dump()
        yield event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage})
        yield event("message_stop", {"type": "message_stop"})
    except Exception as exc:
        yield error_event(exc)


def _start(reply: Reply, result: RequestResult) -> dict[str, Any]:
    message = {
        "id": reply.message_id,
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": reply.usage(result, 0).model_dump(),
    }
    return {"type": "message_start", "message": message}
