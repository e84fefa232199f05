"""What the engine returns for a request: deltas (what each sample produced since the last output),
and the accumulator that folds them into whole completions for callers that wait for the end."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.request import Request, Sequence


@dataclass
class CompletionDelta:
    """One sample's news: tokens, visible text and logprobs after the previous delta."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort" | "error" | None while running
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    error: str | None = None  # a user-facing message when finish_reason is "error"

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionDelta]  # samples with news only
    num_cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    metrics: dict[str, float] = field(default_factory=dict)  # arrival, first_token, finish (s)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)


def take_delta(seq: Sequence) -> CompletionDelta | None:
    """seq's news since the last call (None when there is none); marks it sent."""
    finished = seq.is_finished
    text = seq.detok.visible_text(finished)
    start, end = seq.num_prompt_tokens + seq.num_sent_tokens, seq.num_tokens
    new_text = text[seq.num_sent_chars :]
    if end == start and not new_text and (not finished or seq.finish_sent):
        return None
    lp = None if seq.logprobs is None else seq.logprobs[seq.num_sent_tokens :]
    top = None if seq.top_logprobs is None else seq.top_logprobs[seq.num_sent_tokens :]
    seq.num_sent_tokens = end - seq.num_prompt_tokens
    seq.num_sent_chars = len(text)
    seq.finish_sent = finished
    return CompletionDelta(
        seq.index, new_text, list(seq.token_ids[start:end]), seq.finish_reason, lp, top, seq.error
    )


def request_output(request: Request, finished: bool) -> RequestOutput:
    deltas = [take_delta(s) for s in sorted(request.seqs, key=lambda s: s.index)]
    first = request.seqs[0]
    metrics = {"arrival_time": request.arrival_time}
    if first.first_token_time is not None:
        metrics["first_token_time"] = first.first_token_time
    if finished:
        metrics["finish_time"] = time.monotonic()
    return RequestOutput(
        request.request_id,
        request.prompt_token_ids,
        [d for d in deltas if d is not None],
        first.num_cached_tokens,
        dict(first.cached_by_tier),
        finished,
        metrics,
    )


@dataclass
class Completion:
    """One whole sample, folded from its deltas."""

    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[dict[int, float]] | None = None
    error: str | None = None

    def add(self, delta: CompletionDelta) -> None:
        self.text += delta.text
        self.token_ids += delta.token_ids
        self.finish_reason = delta.finish_reason
        self.error = delta.error
        if delta.logprobs is not None:
            if self.logprobs is None:
                self.logprobs, self.top_logprobs = [], []
            self.logprobs += delta.logprobs
            self.top_logprobs += delta.top_logprobs or []  # type: ignore[operator]


@dataclass
class RequestResult:
    """A whole request: every sample folded from the stream of RequestOutputs."""

    request_id: str
    prompt_token_ids: list[int] = field(default_factory=list)
    outputs: list[Completion] = field(default_factory=list)
    num_cached_tokens: int = 0
    cached_tokens_by_tier: dict[str, int] = field(default_factory=dict)
    finished: bool = False
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, out: RequestOutput) -> None:
        self.prompt_token_ids = out.prompt_token_ids
        for delta in out.outputs:
            while len(self.outputs) <= delta.index:
                self.outputs.append(Completion(len(self.outputs)))
            self.outputs[delta.index].add(delta)
        self.num_cached_tokens = out.num_cached_tokens
        self.cached_tokens_by_tier = out.cached_tokens_by_tier
        self.finished = out.finished
        self.metrics = out.metrics
