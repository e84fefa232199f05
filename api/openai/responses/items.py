"""Responses items, tools and formats in chat terms, so the one chat path renders and constrains
them: items -> chat messages (as api/openai/protocol.py's template_message gives them to
templates), function tools and tool_choice -> OpenAI's chat `Tool` / `ToolChoice`, text.format ->
a response_format. A conversation is kept as item dicts (the store's record) and read back here."""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter

from api.openai.protocol import ChatMessage, template_message
from api.openai.protocol_tools import (
    CalledFunction,
    FunctionDefinition,
    FunctionName,
    JsonObjectFormat,
    JsonSchemaFormat,
    JsonSchemaSpec,
    MessageToolCall,
    NamedToolChoice,
    ResponseFormat,
    TextFormat,
    Tool,
)
from api.openai.protocol_tools import ToolChoice as ChatToolChoice
from api.openai.responses.protocol import (
    FunctionCallItem,
    FunctionCallOutputItem,
    FunctionTool,
    InputItem,
    Item,
    MessageItem,
    NamedFunction,
    TextConfig,
    TextFormatJsonObject,
    TextFormatJsonSchema,
    ToolChoice,
)

_ITEMS = TypeAdapter(list[Item])


def item_dicts(items: list[InputItem]) -> list[dict[str, Any]]:
    return [i.model_dump(mode="json", exclude_none=True, by_alias=True) for i in items]


def read_items(stored: list[dict[str, Any]]) -> list[InputItem]:
    """A stored conversation (input items and our output items, as dicts) as items again."""
    return _ITEMS.validate_python(stored)


def chat_messages(instructions: str | None, items: list[InputItem]) -> list[dict[str, Any]]:
    """The template's messages: `instructions` as the system message, then the items; a turn's
    function calls join its assistant message, a call's output is a tool message."""
    messages: list[ChatMessage] = []
    if instructions:
        messages.append(ChatMessage(role="system", content=instructions))
    names: dict[str, str] = {}  # call_id -> function name
    for item in items:
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=item.role, content=item.text()))
        elif isinstance(item, FunctionCallItem):
            names[item.call_id] = item.name
            _add_call(messages, item)
        elif isinstance(item, FunctionCallOutputItem):
            tool = ChatMessage(
                role="tool",
                content=item.text(),
                tool_call_id=item.call_id,
                name=names.get(item.call_id),
            )
            messages.append(tool)
    return [template_message(m) for m in messages]


def _add_call(messages: list[ChatMessage], item: FunctionCallItem) -> None:
    call = MessageToolCall(
        id=item.call_id, function=CalledFunction(name=item.name, arguments=item.arguments)
    )
    last = messages[-1] if messages else None
    if last is not None and last.role == "assistant":
        last.tool_calls = [*(last.tool_calls or []), call]
        if last.content == "":
            last.content = None
        return
    messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))


def chat_tools(tools: list[FunctionTool] | None) -> list[Tool] | None:
    if not tools:
        return None
    return [
        Tool(
            type="function",
            function=FunctionDefinition(
                name=t.name, description=t.description, parameters=t.parameters, strict=t.strict
            ),
        )
        for t in tools
    ]


def chat_tool_choice(choice: ToolChoice | None) -> ChatToolChoice | None:
    if isinstance(choice, NamedFunction):
        return NamedToolChoice(type="function", function=FunctionName(name=choice.name))
    return choice


def response_format(text: TextConfig | None) -> ResponseFormat | None:
    fmt = text.format if text is not None else None
    if isinstance(fmt, TextFormatJsonObject):
        return JsonObjectFormat(type="json_object")
    if isinstance(fmt, TextFormatJsonSchema):
        spec = {"name": fmt.name, "schema": fmt.json_schema}
        if fmt.description is not None:
            spec["description"] = fmt.description
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        return JsonSchemaFormat(type="json_schema", json_schema=JsonSchemaSpec.model_validate(spec))
    return None if fmt is None else TextFormat(type="text")
