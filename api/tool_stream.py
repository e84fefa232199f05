"""One choice's text split into content and tool calls as it streams: content is passed on until
the parser sees where calls start (never half a marker), calls are handed out as they close, and
at the end a region that holds no call is given back as content. A whole response is the same
split run once (`split_whole`), so streamed and whole answers agree."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from api.protocol_tools import DeltaFunctionCall, DeltaToolCall, FunctionCall, ToolCall
from api.tool_parsers import ParsedCall, ToolParser


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass
class ToolStream:
    parser: ToolParser
    parallel: bool = True
    text: str = ""
    _content_sent: int = 0  # characters of `text` handed out as content
    _region: int | None = None  # where the calls start
    calls: list[ParsedCall] = field(default_factory=list)

    def feed(self, delta: str, final: bool = False) -> tuple[str, list[ParsedCall]]:
        """The content and the newly closed calls `delta` (then, if final, the end) gives."""
        self.text += delta
        if self._region is None:
            self._region = self.parser.start(self.text)
        if self._region is None:
            safe = len(self.text) if final else len(self.text) - self.parser.holdback(self.text)
            return self._content(safe), []
        content = self._content(self._region)
        found = self.parser.parse(self.text[self._region :], final)
        if not self.parallel:
            found = found[:1]
        new = found[len(self.calls) :]
        self.calls += new
        if final and not self.calls:  # the region was no call after all: it is content
            content += self._content(len(self.text))
        return content, new

    def _content(self, end: int) -> str:
        start, self._content_sent = self._content_sent, max(self._content_sent, end)
        return self.text[start:end]


def split_whole(parser: ToolParser, parallel: bool, text: str) -> tuple[str | None, list[ToolCall]]:
    """A finished text -> (content, None when empty or blank; its calls)."""
    content, calls = ToolStream(parser, parallel).feed(text, final=True)
    return (content if content.strip() else None), [whole_call(c) for c in calls]


def whole_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))


def call_deltas(index: int, call: ParsedCall) -> list[DeltaToolCall]:
    """A call as OpenAI streams it: the opening delta (id, type, name, arguments ""), then its
    arguments (one fragment: the call is parsed once it closes)."""
    first = DeltaToolCall(
        index=index,
        id=call_id(),
        type="function",
        function=DeltaFunctionCall(name=call.name, arguments=""),
    )
    rest = DeltaToolCall(index=index, function=DeltaFunctionCall(arguments=call.arguments))
    return [first, rest]
