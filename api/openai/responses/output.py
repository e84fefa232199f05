"""The model's text as Responses output items, as it streams: content is one assistant message,
each call a function_call item (read out by the chat path's ToolStream, so a call cut by the
token limit is an item with the arguments written so far, never markup in the text). The writer
says what happened as events (`Opened`, `TextDelta`, `ArgumentsDelta`, `Closed`); a whole response
is the same writer fed once, so whole and streamed answers agree."""

from __future__ import annotations

from dataclasses import dataclass, field

from api.openai.responses.objects import (
    FunctionCallOutput,
    ItemStatus,
    MessageOutput,
    OutputItem,
    OutputTextPart,
    new_id,
)
from api.openai.tool_plan import ToolPlan
from api.openai.tool_stream import ToolStream


@dataclass(frozen=True)
class Opened:
    index: int  # output_index
    item: OutputItem  # as it starts: no text, arguments ""


@dataclass(frozen=True)
class TextDelta:
    index: int
    item_id: str
    text: str


@dataclass(frozen=True)
class ArgumentsDelta:
    index: int
    item_id: str
    text: str


@dataclass(frozen=True)
class Closed:
    index: int
    item: OutputItem  # whole


Event = Opened | TextDelta | ArgumentsDelta | Closed


@dataclass
class OutputWriter:
    plan: ToolPlan | None
    items: list[OutputItem] = field(default_factory=list)  # opened so far, in order
    _open: int | None = None  # index of the item being written
    _pending: str = ""  # leading whitespace, held until the message has more
    _split: ToolStream | None = None
    _calls: dict[int, int] = field(default_factory=dict)  # ToolStream call index -> item index

    def __post_init__(self) -> None:
        parser = None if self.plan is None else self.plan.parser
        if parser is not None:
            self._split = ToolStream(parser, self.plan.parallel)

    def feed(self, text: str, final: bool, cut: bool) -> list[Event]:
        """The events `text` (then, if final, the end) gives; `cut`: ended at the token limit."""
        if self._split is None:
            content, calls = text, []
        else:
            content, calls = self._split.feed(text, final, cut)
        events = self._content(content)
        for part in calls:
            if part.id is not None:
                events += self._close()
                call = FunctionCallOutput(
                    id=new_id("fc"),
                    call_id=part.id,
                    name=part.function.name or "",
                    arguments="",
                    status="in_progress",
                )
                events.append(self._start(call))
                self._calls[part.index] = self._open  # type: ignore[assignment]
            elif part.function.arguments:
                index = self._calls[part.index]
                item = self.items[index]
                assert isinstance(item, FunctionCallOutput)
                item.arguments += part.function.arguments
                events.append(ArgumentsDelta(index, item.id, part.function.arguments))
        if final:
            if not self.items:  # nothing but blanks was written: a message of them
                events.append(self._start(_message()))
                events += self._content(self._pending, hold=False)
            events += self._close("incomplete" if cut else "completed")
        return events

    def _content(self, text: str, hold: bool = True) -> list[Event]:
        """With tools, blank content is held until more comes (what precedes calls is dropped)."""
        if not text:
            return []
        current = None if self._open is None else self.items[self._open]
        if not isinstance(current, MessageOutput):
            text, self._pending = self._pending + text, ""
            if hold and self._split is not None and not text.strip():
                self._pending = text
                return []
            events = self._close()
            events.append(self._start(_message()))
            current = self.items[self._open]  # type: ignore[index]
        else:
            events = []
        assert isinstance(current, MessageOutput)
        current.content[0].text += text
        events.append(TextDelta(self._open, current.id, text))  # type: ignore[arg-type]
        return events

    def _start(self, item: OutputItem) -> Opened:
        self.items.append(item)
        self._open = len(self.items) - 1
        return Opened(self._open, item.model_copy(deep=True))

    def _close(self, status: ItemStatus = "completed") -> list[Event]:
        if self._open is None:
            return []
        index, self._open = self._open, None
        item = self.items[index]
        item.status = status
        return [Closed(index, item)]


def _message() -> MessageOutput:
    return MessageOutput(id=new_id("msg"), status="in_progress", content=[OutputTextPart(text="")])
