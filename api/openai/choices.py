"""The one renderer of OpenAI choices, for whole responses and streamed chunks alike: a sample
(a whole Completion, or a delta of one) -> its choice, with the text or message, logprobs, finish
reason and token ids the request asked for. A whole completion renders as its sample's one and
last piece; a stream renders each delta with news as it comes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from api.openai.logprobs import Sample, chat_logprobs, completion_logprobs
from api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatLogprobs,
    CompletionChoice,
    Delta,
    PromptTokensDetails,
    Usage,
)
from api.openai.tool_parsers import ToolParser
from api.openai.tool_plan import ToolPlan
from api.openai.tool_stream import ToolStream, split_whole
from api.serving.engine_errors import raise_if_failed
from engine.outputs import CompletionDelta, RequestOutput, RequestResult

FINISH_REASONS = {"stop": "stop", "length": "length", "abort": "stop"}


def finish_reason(raw: str | None, called_tools: bool = False) -> str | None:
    """OpenAI's finish reason; a stop after tool calls is "tool_calls"."""
    if raw is None:
        return None
    reason = FINISH_REASONS.get(raw, raw)
    return "tool_calls" if called_tools and reason == "stop" else reason


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


@dataclass(frozen=True)
class ChoiceShape:
    """What each choice carries beyond its text, as the request asked."""

    n: int  # samples per prompt
    logprobs: bool
    token_ids: bool  # extension (return_token_ids): token ids in the choices

    def has_news(self, delta: CompletionDelta) -> bool:
        """A delta worth a chunk: text, its end, or (when chunks carry per-token data) tokens."""
        per_token = self.logprobs or self.token_ids
        return bool(delta.text) or delta.finished or (bool(delta.token_ids) and per_token)

    def ids(self, sample: Sample) -> list[int] | None:
        return sample.token_ids if self.token_ids else None


@dataclass
class CompletionChoices:
    """/v1/completions choices: index job * n + sample; `echo` (per job) leads a whole text."""

    tokenizer: Any
    shape: ChoiceShape
    echo: list[str] | None = None
    _text_sent: dict[int, int] = field(default_factory=dict)  # streamed characters per choice

    def whole(self, job: int, result: RequestResult) -> list[CompletionChoice]:
        head = self.echo[job] if self.echo else ""
        prompt_ids = result.prompt_token_ids if self.shape.token_ids else None
        return [self._choice(job, c, head, len(head), prompt_ids) for c in result.outputs]

    def echoed(self) -> list[CompletionChoice]:
        """A stream's first chunk with echo: each prompt's text, once per sample."""
        n, echo = self.shape.n, self.echo or []
        return [
            CompletionChoice(index=j * n + i, text=t) for j, t in enumerate(echo) for i in range(n)
        ]

    def streamed(self, job: int, out: RequestOutput) -> list[CompletionChoice]:
        choices = []
        for d in out.outputs:
            if not self.shape.has_news(d):  # a failed sample has news: its end
                continue
            key = job * self.shape.n + d.index
            text_start = self._text_sent.get(key, 0)
            self._text_sent[key] = text_start + len(d.text)
            choices.append(self._choice(job, d, "", text_start, None))
        return choices

    def _choice(
        self, job: int, sample: Sample, head: str, text_start: int, prompt_ids: list[int] | None
    ) -> CompletionChoice:
        raise_if_failed(sample)
        lp = (
            completion_logprobs(self.tokenizer, sample, text_start) if self.shape.logprobs else None
        )
        return CompletionChoice(
            index=job * self.shape.n + sample.index,
            text=head + sample.text,
            logprobs=lp,
            finish_reason=finish_reason(sample.finish_reason),
            prompt_token_ids=prompt_ids,
            token_ids=self.shape.ids(sample),
        )


@dataclass
class ChatChoices:
    """/v1/chat/completions choices; with tools, each sample's text split into content and calls
    (whole: split once; streamed: a ToolStream per sample)."""

    tokenizer: Any
    shape: ChoiceShape
    tools: ToolPlan | None = None
    _splits: dict[int, ToolStream] = field(default_factory=dict)

    @property
    def parser(self) -> ToolParser | None:
        """What reads calls out of the text; None: the text is all content."""
        return None if self.tools is None else self.tools.parser

    @property
    def parallel(self) -> bool:
        return self.tools is None or self.tools.parallel

    def whole(self, result: RequestResult) -> list[ChatChoice]:
        prompt_ids = result.prompt_token_ids if self.shape.token_ids else None
        choices = []
        for c in result.outputs:
            raise_if_failed(c)
            content: str | None = c.text
            calls = None
            if self.parser is not None:
                cut = c.finish_reason == "length"
                content, calls = split_whole(self.parser, self.parallel, c.text, cut)
            choices.append(
                ChatChoice(
                    index=c.index,
                    message=AssistantMessage(content=content, tool_calls=calls or None),
                    logprobs=self._logprobs(c),
                    finish_reason=finish_reason(c.finish_reason, bool(calls)),
                    prompt_token_ids=prompt_ids,
                    token_ids=self.shape.ids(c),
                )
            )
        return choices

    def opening(self) -> list[ChatChunkChoice]:
        """A stream's first chunk: the assistant's role, per sample."""
        return [
            ChatChunkChoice(index=i, delta=Delta(role="assistant", content=""))
            for i in range(self.shape.n)
        ]

    def streamed(self, out: RequestOutput) -> list[list[ChatChunkChoice]]:
        """The chunks (each a list of choices) an output delta gives."""
        chunks: list[list[ChatChunkChoice]] = []
        for d in out.outputs:
            raise_if_failed(d)
            if self.parser is not None:
                chunks += self._with_tools(d, self.parser)
            elif self.shape.has_news(d):
                choice = ChatChunkChoice(
                    index=d.index,
                    delta=Delta(content=d.text),
                    logprobs=self._logprobs(d),
                    finish_reason=finish_reason(d.finish_reason),
                    token_ids=self.shape.ids(d),
                )
                chunks.append([choice])
        return chunks

    def _with_tools(self, d: CompletionDelta, parser: ToolParser) -> list[list[ChatChunkChoice]]:
        split = self._splits.setdefault(d.index, ToolStream(parser, self.parallel))
        content, calls = split.feed(d.text, d.finished, cut=d.finish_reason == "length")
        chunks = []
        per_token = self.shape.logprobs or self.shape.token_ids
        if content or (per_token and d.token_ids):
            delta = Delta(content=content)
            lp, ids = self._logprobs(d), self.shape.ids(d)
            chunks.append([ChatChunkChoice(index=d.index, delta=delta, logprobs=lp, token_ids=ids)])
        for part in calls:
            chunks.append([ChatChunkChoice(index=d.index, delta=Delta(tool_calls=[part]))])
        if d.finished:
            reason = finish_reason(d.finish_reason, bool(split.calls))
            chunks.append([ChatChunkChoice(index=d.index, delta=Delta(), finish_reason=reason)])
        return chunks

    def _logprobs(self, sample: Sample) -> ChatLogprobs | None:
        return chat_logprobs(self.tokenizer, sample) if self.shape.logprobs else None
