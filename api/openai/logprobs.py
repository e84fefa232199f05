"""A sample's token logprobs in OpenAI's two shapes: chat (`content` entries with bytes and top
alternatives) and legacy completions (tokens, offsets, top alternatives by text)."""

from __future__ import annotations

from typing import Any

from api.openai.protocol import ChatLogprobs, CompletionLogprobs, TokenLogprob, TopLogprob
from engine.outputs import Completion, CompletionDelta

Sample = CompletionDelta | Completion  # what carries token ids and logprobs


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
