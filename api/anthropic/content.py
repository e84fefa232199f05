"""A sample -> Anthropic content blocks and its stop reason. With tools, the text is split into
text and tool calls by the protocol-neutral ToolStream (api/openai/tool_stream.py), so a call is
a tool_use block whose input is the call's arguments, and a call cut by max_tokens is a tool_use
block with the input written so far (its JSON read leniently), never markup in text."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from pydantic_core import from_json

from api.anthropic.breakpoints import Breakpoint
from api.anthropic.protocol import MessageResponse, StopReason, TextContent, ToolUseContent, Usage
from api.anthropic.usage import usage_of
from api.openai.tool_plan import ToolPlan
from api.openai.tool_stream import split_whole
from api.serving.engine_errors import raise_if_failed
from engine.outputs import Completion, RequestResult


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def tool_input(arguments: str) -> dict[str, Any]:
    """A call's arguments as an object; a cut call's partial JSON as far as it goes."""
    try:
        value = from_json(arguments, allow_partial=True) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


@dataclass(frozen=True)
class Ending:
    stop_reason: StopReason
    stop_sequence: str | None = None


def ending(sample: Completion, called: bool, stops: tuple[str, ...], tokenizer: Any) -> Ending:
    """max_tokens (cut), tool_use (ended after calls), stop_sequence (with the one that matched:
    the text is cut before it, so the decoded tokens go on with it), else end_turn."""
    if sample.finish_reason == "length":
        return Ending("max_tokens")
    if called:
        return Ending("tool_use")
    if stops and sample.finish_reason == "stop":
        full = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
        matched = [s for s in stops if full.startswith(s, len(sample.text))]
        if matched:
            return Ending("stop_sequence", min(matched, key=len))
    return Ending("end_turn")


def whole_content(sample: Completion, plan: ToolPlan | None) -> list[TextContent | ToolUseContent]:
    """A finished sample's blocks: its text (when not blank), then its calls."""
    raise_if_failed(sample)
    if plan is None or plan.parser is None:
        return [TextContent(text=sample.text)] if sample.text else []
    cut = sample.finish_reason == "length"
    text, calls = split_whole(plan.parser, plan.parallel, sample.text, cut)
    blocks: list[TextContent | ToolUseContent] = [TextContent(text=text)] if text else []
    blocks += [
        ToolUseContent(
            id=tool_use_id(), name=c.function.name, input=tool_input(c.function.arguments)
        )
        for c in calls
    ]
    return blocks


@dataclass(frozen=True)
class Reply:
    """What one request's answer is rendered with, whole or streamed."""

    message_id: str
    model: str
    plan: ToolPlan | None
    stops: tuple[str, ...]
    breakpoints: list[Breakpoint]
    tokenizer: Any

    def usage(self, result: RequestResult, output_tokens: int) -> Usage:
        prompt = len(result.prompt_token_ids)
        return usage_of(prompt, result.num_cached_tokens, self.breakpoints, output_tokens)

    def message(self, result: RequestResult) -> MessageResponse:
        sample = sample_of(result)
        content = whole_content(sample, self.plan)
        called = any(isinstance(b, ToolUseContent) for b in content)
        end = ending(sample, called, self.stops, self.tokenizer)
        return MessageResponse(
            id=self.message_id,
            model=self.model,
            content=content,
            stop_reason=end.stop_reason,
            stop_sequence=end.stop_sequence,
            usage=self.usage(result, len(sample.token_ids)),
        )


def sample_of(result: RequestResult) -> Completion:
    """The request's one sample (n is 1 here)."""
    return result.outputs[0] if result.outputs else Completion(0)
