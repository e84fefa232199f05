"""Engine outputs -> OpenAI response objects (whole responses, stream chunks, usage, logprobs)."""

from __future__ import annotations

import json
from typing import Any

from api.errors import ApiError
from api.openai.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from engine.outputs import Completion, CompletionDelta, RequestResult

Sample = CompletionDelta | Completion  # what carries token ids and logprobs

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def finish_reason(raw: str | None, called_tools: bool = False) -> str | None:
    """OpenAI's finish reason; a stop after tool calls is "tool_calls"."""
    if raw is None:
        return None
    reason = FINISH_REASONS.get(raw, raw)
    return "tool_calls" if called_tools and reason == "stop" else reason


def raise_if_failed(sample: Sample) -> None:
    """A sample the engine ended with an error (its grammar rejected a token): the request fails
    with that message, as a JSON error (whole) or an SSE error event (streamed)."""
    if sample.finish_reason == "error":
        message = getattr(sample, "error", None) or "the output constraint failed"
        raise ApiError(422, f"Generation failed: {message}", code="generation_error")


def usage_of(finals: list[RequestResult]) -> Usage:
    prompt = sum(len(out.prompt_token_ids) for out in finals)
    completion = sum(len(c.token_ids) for out in finals for c in out.outputs)
    cached = sum(out.num_cached_tokens for out in finals)
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
    )


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def _piece(tokenizer: Any, token_id: int) -> str:
    return tokenizer.decode([token_id])


def chat_logprobs(tokenizer: Any, choice: Sample) -> ChatLogprobs | None:
    """Chat-style logprobs of a choice's tokens (a delta's, or a whole completion's)."""
    if choice.logprobs is None:
        return None
    entries = []
    tops = choice.top_logprobs or []
    for i in range(len(choice.logprobs)):
        token = _piece(tokenizer, choice.token_ids[i])
        top = tops[i] if i < len(tops) else {}
        entries.append(
            TokenLogprob(
                token=token,
                logprob=choice.logprobs[i],
                bytes=list(token.encode()),
                top_logprobs=[
                    TopLogprob(
                        token=(t := _piece(tokenizer, tid)), logprob=lp, bytes=list(t.encode())
                    )
                    for tid, lp in sorted(top.items(), key=lambda kv: -kv[1])
                ],
            )
        )
    return ChatLogprobs(content=entries)


def completion_logprobs(
    tokenizer: Any, choice: Sample, text_start: int
) -> CompletionLogprobs | None:
    """Legacy completion logprobs of a choice's tokens; offsets count from text_start."""
    if choice.logprobs is None:
        return None
    out = CompletionLogprobs()
    tops = choice.top_logprobs or []
    offset = text_start
    for i in range(len(choice.logprobs)):
        token = _piece(tokenizer, choice.token_ids[i])
        out.tokens.append(token)
        out.token_logprobs.append(choice.logprobs[i])
        top = tops[i] if i < len(tops) else {}
        out.top_logprobs.append({_piece(tokenizer, t): lp for t, lp in top.items()} or None)
        out.text_offset.append(offset)
        offset += len(token)
    return out
