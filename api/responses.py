"""Engine outputs -> OpenAI response objects (whole responses, stream chunks, usage, logprobs)."""

from __future__ import annotations

import json
from typing import Any

from api.protocol import (
    ChatLogprobs,
    CompletionLogprobs,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def finish_reason(raw: str | None) -> str | None:
    return None if raw is None else FINISH_REASONS.get(raw, raw)


def usage_of(finals: list[Any]) -> Usage:
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


def chat_logprobs(tokenizer: Any, choice: Any, start: int, end: int) -> ChatLogprobs | None:
    """Chat-style logprobs of output tokens [start, end) of a choice."""
    if choice.logprobs is None:
        return None
    entries = []
    tops = choice.top_logprobs or []
    for i in range(start, min(end, len(choice.logprobs))):
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
    tokenizer: Any, choice: Any, start: int, end: int, text_start: int
) -> CompletionLogprobs | None:
    """Legacy completion logprobs of output tokens [start, end); offsets count from text_start."""
    if choice.logprobs is None:
        return None
    out = CompletionLogprobs()
    tops = choice.top_logprobs or []
    offset = text_start
    for i in range(start, min(end, len(choice.logprobs))):
        token = _piece(tokenizer, choice.token_ids[i])
        out.tokens.append(token)
        out.token_logprobs.append(choice.logprobs[i])
        top = tops[i] if i < len(tops) else {}
        out.top_logprobs.append({_piece(tokenizer, t): lp for t, lp in top.items()} or None)
        out.text_offset.append(offset)
        offset += len(token)
    return out


class DeltaTracker:
    """What of each choice's cumulative text/tokens has already been sent."""

    def __init__(self) -> None:
        self.text: dict[int, int] = {}
        self.tokens: dict[int, int] = {}
        self.finished: set[int] = set()

    def advance(self, key: int, choice: Any) -> tuple[str, int, int, bool]:
        """(new text, first new token, end token, finished now) for one choice."""
        sent = self.text.get(key, 0)
        text = choice.text[sent:] if len(choice.text) > sent else ""
        start = self.tokens.get(key, 0)
        end = len(choice.token_ids)
        self.text[key] = max(sent, len(choice.text))
        self.tokens[key] = end
        done = choice.finish_reason is not None and key not in self.finished
        if done:
            self.finished.add(key)
        return text, start, end, done
