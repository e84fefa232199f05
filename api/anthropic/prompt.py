"""Anthropic's conversation -> the ChatPrompt chat templates render, and its tools onto OpenAI's
(tool_plan and tool_format are protocol-neutral).

- `system` (a string or text blocks, joined by a blank line) is the first, system message;
- a user message's text blocks are one user message, its tool_result blocks tool messages (with
  the tool_call_id and the name of the call they answer), in the order given;
- an assistant message's text blocks are its content, its tool_use blocks its tool_calls;
- a final assistant message is a prefill: the answer continues its text (`prefill`), as in
  Anthropic's service (which refuses a prefill ending in whitespace, as we do).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from api.anthropic.protocol import (
    CountTokensRequest,
    Message,
    TextBlock,
    ToolChoiceAny,
    ToolChoiceAuto,
    ToolChoiceTool,
    ToolDefinition,
    ToolResultBlock,
    ToolUseBlock,
)
from api.errors import ApiError
from api.openai.protocol_tools import (
    FunctionDefinition,
    FunctionName,
    NamedToolChoice,
    Tool,
    ToolChoice,
)
from radixcache.shared.chat_template import ChatPrompt

JOIN = "\n\n"  # between the text blocks of one message (or of the system prompt)


@dataclass(frozen=True)
class Conversation:
    """What the template renders, in Anthropic's prefix order: tools, system, messages."""

    tools: list[ToolDefinition]
    system: list[TextBlock]
    messages: list[Message]

    def chat_prompt(self) -> ChatPrompt:
        tools = [openai_tool(t).model_dump(exclude_none=True) for t in self.tools] or None
        system = JOIN.join(b.text for b in self.system)
        messages = [{"role": "system", "content": system}] if self.system else []
        names = {
            b.id: b.name for m in self.messages for b in m.blocks() if isinstance(b, ToolUseBlock)
        }
        for m in self.messages:
            messages += _user(m, names) if m.role == "user" else [_assistant(m)]
        return ChatPrompt(messages, tools, {})

    def prefill(self) -> str | None:
        """The final assistant message's text the answer continues, if the last is one."""
        last = self.messages[-1]
        if last.role != "assistant":
            return None
        if any(not isinstance(b, TextBlock) for b in last.blocks()):
            raise ApiError(
                400,
                "The final assistant message (a prefill) may hold only text blocks",
                param="messages",
            )
        text = JOIN.join(b.text for b in last.blocks())  # type: ignore[union-attr]
        if text != text.rstrip():
            raise ApiError(
                400,
                "final assistant content cannot end with trailing whitespace",
                param="messages",
            )
        return text or None


def conversation(req: CountTokensRequest) -> Conversation:
    return Conversation(list(req.tools or ()), req.system_blocks(), list(req.messages))


def _user(m: Message, names: dict[str, str]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    texts: list[str] = []
    for b in m.blocks():
        if isinstance(b, ToolResultBlock):
            if texts:
                out.append({"role": "user", "content": JOIN.join(texts)})
                texts = []
            result = {"role": "tool", "content": b.text(), "tool_call_id": b.tool_use_id}
            if b.tool_use_id in names:
                result["name"] = names[b.tool_use_id]
            out.append(result)
        elif isinstance(b, TextBlock):
            texts.append(b.text)
        else:
            raise ApiError(400, "A user message cannot hold tool_use blocks", param="messages")
    if texts or not out:
        out.append({"role": "user", "content": JOIN.join(texts)})
    return out


def _assistant(m: Message) -> dict[str, Any]:
    texts = [b.text for b in m.blocks() if isinstance(b, TextBlock)]
    calls = [
        {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
        for b in m.blocks()
        if isinstance(b, ToolUseBlock)
    ]
    if any(isinstance(b, ToolResultBlock) for b in m.blocks()):
        raise ApiError(400, "An assistant message cannot hold tool_result blocks", param="messages")
    out: dict[str, Any] = {"role": "assistant", "content": JOIN.join(texts) if texts else None}
    if calls:
        out["tool_calls"] = calls
    elif out["content"] is None:
        out["content"] = ""
    return out


def openai_tool(t: ToolDefinition) -> Tool:
    fn = FunctionDefinition(
        name=t.name, description=t.description, parameters=t.input_schema.model_dump()
    )
    return Tool(type="function", function=fn)


def openai_tool_choice(req: CountTokensRequest) -> tuple[ToolChoice | None, bool]:
    """tool_choice -> (OpenAI's choice, parallel calls allowed): auto -> "auto", any ->
    "required", tool -> the named function, none -> "none"; disable_parallel_tool_use -> one
    call at most."""
    choice = req.tool_choice
    if choice is None:
        return None, True
    parallel = not getattr(choice, "disable_parallel_tool_use", False)
    if isinstance(choice, ToolChoiceAuto):
        return "auto", parallel
    if isinstance(choice, ToolChoiceAny):
        return "required", parallel
    if isinstance(choice, ToolChoiceTool):
        named = NamedToolChoice(type="function", function=FunctionName(name=choice.name))
        return named, parallel
    return "none", parallel
