"""Anthropic Messages request and response models (the subset radixcache serves).

Requests are strict and closed like every request model here (api/openai/protocol.py): a field we
do not honour is a 400 naming it. Honoured: model, max_tokens, messages (user/assistant; text,
tool_use and tool_result blocks), system (a string or text blocks), tools (custom tools with
input_schema), tool_choice (auto, any, tool, none; disable_parallel_tool_use), stop_sequences,
temperature, top_p, top_k, stream, and cache_control (on blocks, tools, or top-level). Accepted
and ignored (bookkeeping, as the OpenAI routes allow-list theirs): metadata.user_id and
service_tier (one server has one tier). Everything else (thinking, images, documents, citations,
server tools, container, mcp_servers, output_config, ...) is refused. /v1/messages/count_tokens
takes the conversation's fields only (model, messages, system, tools, tool_choice, cache_control).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from api.openai.protocol import Int

MAX_BREAKPOINTS = 4  # cache_control blocks per request, as Anthropic
MAX_STOP_SEQUENCES = 16
TOOL_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"  # Anthropic's tool-name rule (64: OpenAI's cap)
TTL_SECONDS = {"5m": 300.0, "1h": 3600.0}


class _Closed(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class CacheControl(_Closed):
    """A prompt-cache breakpoint: the prefix up to this block is kept for `ttl`."""

    type: Literal["ephemeral"]
    ttl: Literal["5m", "1h"] = "5m"

    @property
    def seconds(self) -> float:
        return TTL_SECONDS[self.ttl]


class TextBlock(_Closed):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    citations: None = None  # null only (what a client echoes of an answer): none are served


class DirectCaller(_Closed):
    type: Literal["direct"]


class ToolUseBlock(_Closed):
    """A call the assistant made earlier in the conversation."""

    type: Literal["tool_use"]
    id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    input: dict[str, Any]
    cache_control: CacheControl | None = None
    caller: DirectCaller | None = None  # the model's own call (the only kind served)
    toolset_name: None = None  # null only: no toolsets are served


class ResultText(_Closed):
    """A text block inside a tool_result (no breakpoint inside a result: mark the result)."""

    type: Literal["text"]
    text: str
    citations: None = None


class ToolResultBlock(_Closed):
    """A call's result, in a user message. `is_error`: the text the model reads is marked as an
    error ("Error: ..."), the one way a chat template can tell it."""

    type: Literal["tool_result"]
    tool_use_id: str = Field(min_length=1)
    content: list[ResultText] | str = ""  # a list first: its errors name the field at fault
    is_error: bool = False
    cache_control: CacheControl | None = None

    def text(self) -> str:
        body = (
            self.content if isinstance(self.content, str) else "".join(b.text for b in self.content)
        )
        return f"Error: {body}" if self.is_error else body


ContentBlock = Annotated[TextBlock | ToolUseBlock | ToolResultBlock, Field(discriminator="type")]


class Message(_Closed):
    role: Literal["user", "assistant"]
    content: Annotated[list[ContentBlock], Field(min_length=1)] | str

    def blocks(self) -> list[TextBlock | ToolUseBlock | ToolResultBlock]:
        if isinstance(self.content, str):
            return [TextBlock(type="text", text=self.content)]
        return list(self.content)


class InputSchema(BaseModel):
    """A JSON Schema of the tool's input; its other keywords are kept as given."""

    model_config = ConfigDict(strict=True, extra="allow")
    type: Literal["object"]


class ToolDefinition(_Closed):
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    description: str | None = None
    input_schema: InputSchema
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoiceAuto(_Closed):
    type: Literal["auto"]
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Closed):
    type: Literal["any"]
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Closed):
    type: Literal["tool"]
    name: str = Field(pattern=TOOL_NAME_PATTERN)
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Closed):
    type: Literal["none"]


ToolChoice = Annotated[
    ToolChoiceAuto | ToolChoiceAny | ToolChoiceTool | ToolChoiceNone, Field(discriminator="type")
]


class Metadata(_Closed):
    user_id: str | None = None  # allow-listed: accepted, ignored


class CountTokensRequest(_Closed):
    """/v1/messages/count_tokens: the conversation whose prompt is counted."""

    model: str = Field(min_length=1)
    messages: Annotated[list[Message], Field(min_length=1)]
    system: list[TextBlock] | str | None = None
    tools: Annotated[list[ToolDefinition], Field(max_length=128)] | None = None
    tool_choice: ToolChoice | None = None
    cache_control: CacheControl | None = None  # on the request's last block

    def system_blocks(self) -> list[TextBlock]:
        if self.system is None:
            return []
        if isinstance(self.system, str):
            return [TextBlock(type="text", text=self.system)] if self.system else []
        return list(self.system)


class MessagesRequest(CountTokensRequest):
    max_tokens: Int = Field(ge=1)  # required, as Anthropic
    stop_sequences: Annotated[list[str], Field(max_length=MAX_STOP_SEQUENCES)] | None = None
    temperature: float = Field(1.0, ge=0.0, le=1.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(0, ge=0)  # 0: off
    stream: bool = False
    metadata: Metadata | None = None  # allow-listed: accepted, ignored
    service_tier: Literal["auto", "standard_only"] | None = None  # allow-listed: ignored


class TokenCount(BaseModel):
    input_tokens: int


# ---------------------------------------------------------------- responses


class CacheCreation(BaseModel):
    ephemeral_5m_input_tokens: int = 0
    ephemeral_1h_input_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    cache_creation: CacheCreation


class TextContent(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ToolUseContent(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class MessageResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[TextContent | ToolUseContent]
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: Usage
