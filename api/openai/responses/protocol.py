"""The /v1/responses request: closed and strict like every request model (api/openai/protocol.py),
so a field we do not honour is a 400 naming it. Input items: messages (text parts only),
function_call and function_call_output; tools: functions only.

Honoured: model, input, instructions, tools, tool_choice, parallel_tool_calls, text.format,
max_output_tokens, temperature, top_p, stream, store, previous_response_id, prompt_cache_key,
prompt_cache_retention, metadata (kept and echoed), truncation "disabled" (a prompt beyond the
context window is a 400), include [] (no extra output data). Allow-listed, accepted and ignored
but echoed: `user`, `safety_identifier` (OpenAI-side abuse bookkeeping), `service_tier` (one server
has one tier); in items, what a client echoes of our own output (an item's `id` and `status`, an
output_text's `annotations` and `logprobs`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

from api.openai.protocol import MAX_PROMPT_CACHE_KEY, Int
from api.openai.protocol_tools import MAX_TOOLS, NAME_PATTERN
from api.serving.request_builder import Retention

MAX_ITEMS = 4096


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


# ---------------------------------------------------------------- input items


class InputText(_Closed):
    type: Literal["input_text"]
    text: str


class OutputText(_Closed):
    """An assistant message's text, as a client echoes our output back."""

    type: Literal["output_text"]
    text: str
    annotations: list[Any] | None = None  # allow-listed: our own output echoed
    logprobs: list[Any] | None = None  # allow-listed: our own output echoed


class Refusal(_Closed):
    type: Literal["refusal"]
    refusal: str


Part = Annotated[InputText | OutputText | Refusal, Field(discriminator="type")]
Role = Literal["user", "assistant", "system", "developer"]
Status = Literal["in_progress", "completed", "incomplete"]


class MessageItem(_Closed):
    type: Literal["message"] = "message"
    role: Role
    content: str | list[Part]
    id: str | None = None  # allow-listed: our own output echoed
    status: Status | None = None  # allow-listed: our own output echoed

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.refusal if isinstance(p, Refusal) else p.text for p in self.content)


class FunctionCallItem(_Closed):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str
    arguments: str
    id: str | None = None  # allow-listed: our own output echoed
    status: Status | None = None  # allow-listed: our own output echoed


class FunctionCallOutputItem(_Closed):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[InputText]
    id: str | None = None
    status: Status | None = None

    def text(self) -> str:
        if isinstance(self.output, str):
            return self.output
        return "".join(p.text for p in self.output)


def _item_kind(value: Any) -> str:
    """An item's type; a message may leave it out. Any other type (reasoning, item_reference,
    built-in tool calls) matches no tag: a 400 naming it."""
    if isinstance(value, dict):
        return str(value.get("type", "message"))
    return str(getattr(value, "type", ""))


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem
Item = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")],
    Discriminator(_item_kind),
]


# ---------------------------------------------------------------- tools and formats


class FunctionTool(_Closed):
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # forced calls always follow the schema


class NamedFunction(_Closed):
    type: Literal["function"]
    name: str = Field(pattern=NAME_PATTERN)


ToolChoice = Literal["none", "auto", "required"] | NamedFunction


class TextFormatText(_Closed):
    type: Literal["text"]


class TextFormatJsonObject(_Closed):
    type: Literal["json_object"]


class TextFormatJsonSchema(_Closed):
    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=False)

    type: Literal["json_schema"]
    name: str = Field(pattern=NAME_PATTERN)
    json_schema: dict[str, Any] = Field(alias="schema")
    description: str | None = None
    strict: bool | None = None


TextFormat = Annotated[
    TextFormatText | TextFormatJsonObject | TextFormatJsonSchema, Field(discriminator="type")
]


class TextConfig(_Closed):
    format: TextFormat | None = None


# ---------------------------------------------------------------- the request


class ResponsesRequest(_Closed):
    model: str = Field(min_length=1)
    input: Annotated[list[Item], Field(max_length=MAX_ITEMS)] | Annotated[str, Field(min_length=1)]
    instructions: str | None = None
    tools: Annotated[list[FunctionTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool = True
    text: TextConfig | None = None
    max_output_tokens: Int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stream: bool = False
    store: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = Field(None, max_length=MAX_PROMPT_CACHE_KEY)
    prompt_cache_retention: Retention | None = None
    metadata: Annotated[dict[str, str], Field(max_length=16)] | None = None
    truncation: Literal["disabled"] | None = None  # "auto" (dropping items) is not served
    include: Annotated[list[str], Field(max_length=0)] | None = None  # no extra output data
    user: str | None = None  # allow-listed: accepted, echoed, ignored
    safety_identifier: str | None = None  # allow-listed: accepted, echoed, ignored
    service_tier: str | None = None  # allow-listed: accepted, ignored

    def items(self) -> list[InputItem]:
        """The input as items (a string is one user message)."""
        if isinstance(self.input, str):
            return [MessageItem(role="user", content=self.input)]
        return list(self.input)
