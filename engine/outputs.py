"""What the engine returns for a request (cumulative: each output carries everything so far)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.request import Request


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    metrics: dict[str, float] = field(default_factory=dict)  # arrival, first_token, finish (s)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def request_output(request: Request, finished: bool) -> RequestOutput:
    outs = [
        CompletionOutput(
            s.index,
            s.detok.visible_text(s.is_finished),
            s.output_token_ids,
            s.finish_reason,
            None if s.logprobs is None else list(s.logprobs),
            None if s.top_logprobs is None else list(s.top_logprobs),
        )
        for s in sorted(request.seqs, key=lambda s: s.index)
    ]
    first = request.seqs[0]
    metrics = {"arrival_time": request.arrival_time}
    if first.first_token_time is not None:
        metrics["first_token_time"] = first.first_token_time
    if finished:
        metrics["finish_time"] = time.monotonic()
    return RequestOutput(
        request.request_id,
        request.prompt,
        request.prompt_token_ids,
        outs,
        first.num_cached_tokens,
        dict(first.cached_by_tier),
        finished,
        metrics,
    )
