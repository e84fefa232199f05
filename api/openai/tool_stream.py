"""One choice's text split into content and tool calls as it streams: content is passed on until
the parser sees where calls start (never half a marker); calls go out as OpenAI streams them (a
first delta with index, id, type, name and arguments "", then argument fragments), as they are
written where the parser can tell (hermes), else once each closes; at the end a region that holds
no call is given back as content. An output cut by the token limit (`cut`) inside a call ends
with that call as far as it was written (the parser's `cut`: its name and its arguments prefix),
and its markup never becomes content. A whole response is the same split run once
(`split_whole`), so streamed and whole answers agree: the fragments of a call concatenate to its
arguments. Protocol-neutral: any route's renderer turns these events into its own shape."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from api.openai.protocol_tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from api.openai.tool_parsers import CallProgress, ParsedCall, ToolParser


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolStream:
    parser: ToolParser
    parallel: bool = True
    text: str = ""
    calls: list[ParsedCall] = field(default_factory=list)  # closed calls, in order
    _content_sent: int = 0  # characters of `text` handed out as content
    _region: int | None = None  # where the calls start
    _args_sent: list[str] = field(default_factory=list)  # per call opened: arguments sent

    def feed(
        self, delta: str, final: bool = False, cut: bool = False
    ) -> tuple[str, list[DeltaToolCall]]:
        """The content and the call deltas `delta` (then, if final, the end) gives; `cut`: the
        output ended at the token limit."""
        self.text += delta
        if self._region is None:
            self._region = self.parser.start(self.text)
        if self._region is None:
            whole = final and not cut  # a cut output's half marker is dropped
            safe = len(self.text) if whole else len(self.text) - self.parser.holdback(self.text)
            return self._content(safe), []
        content = self._content(self._region)
        region = self.text[self._region :]
        partial = self.parser.cut(region) if final and cut else None
        if partial is not None:
            return content, self._advance(partial if self.parallel else partial[:1])
        events = self._advance(self._progress(region, final))
        if final and not self._args_sent:  # the region was no call after all: it is content
            content += self._content(len(self.text))
        return content, events

    def _progress(self, region: str, final: bool) -> list[CallProgress]:
        progress = getattr(self.parser, "progress", None)
        if progress is not None:
            found = progress(region, final)
        else:
            found = [
                CallProgress(c.name, c.arguments, True) for c in self.parser.parse(region, final)
            ]
        return found if self.parallel else found[:1]

    def _advance(self, found: list[CallProgress]) -> list[DeltaToolCall]:
        events = []
        for i, call in enumerate(found):
            if i == len(self._args_sent):
                self._args_sent.append("")
                events.append(
                    DeltaToolCall(
                        index=i,
                        id=call_id(),
                        type="function",
                        function=DeltaFunctionCall(name=call.name, arguments=""),
                    )
                )
            sent = self._args_sent[i]
            if call.arguments.startswith(sent) and len(call.arguments) > len(sent):
                fragment = call.arguments[len(sent) :]
                self._args_sent[i] = call.arguments
                events.append(
                    DeltaToolCall(index=i, function=DeltaFunctionCall(arguments=fragment))
                )
            if call.closed and i == len(self.calls):
                self.calls.append(ParsedCall(call.name, call.arguments))
        return events

    def _content(self, end: int) -> str:
        start, self._content_sent = self._content_sent, max(self._content_sent, end)
        return self.text[start:end]


def split_whole(
    parser: ToolParser, parallel: bool, text: str, cut: bool = False
) -> tuple[str | None, list[ToolCall]]:
    """A finished text (`cut`: at the token limit) -> (content, None when empty or blank; its
    calls)."""
    stream = ToolStream(parser, parallel)
    content, _ = stream.feed(text, final=True, cut=cut)
    return (content if content.strip() else None), [whole_call(c) for c in stream.calls]


def whole_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))
