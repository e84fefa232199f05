"""Request and response models of tools and structured outputs: `tools`, `tool_choice`, tool calls
in messages and responses (whole and streamed), `response_format` and vLLM's `structured_outputs`
extension. Strict and closed like every request model (protocol.py)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_TOOLS = 128
MAX_CHOICES = 256
NAME_PATTERN = r"^[a-zA-Z0-9_.-]{1,64}$"  # OpenAI's function-name rule


class _Closed(BaseModel):
    """A field we do not honour is a 400 naming it (api/errors.py words the message)."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=False)


# ---------------------------------------------------------------- tools in a request


class FunctionDefinition(_Closed):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of the arguments object
    strict: bool | None = None  # calls are always schema-constrained when forced


class Tool(_Closed):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Closed):
    name: str = Field(pattern=NAME_PATTERN)


class NamedToolChoice(_Closed):
    type: Literal["function"]
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
Tools = Annotated[list[Tool], Field(min_length=1, max_length=MAX_TOOLS)]


class CalledFunction(_Closed):
    name: str
    arguments: str  # JSON text, as the model wrote it


class MessageToolCall(_Closed):
    """A call in an assistant message of the conversation (what the server answered before)."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


# ---------------------------------------------------------------- output formats


class JsonSchemaSpec(_Closed):
    name: str = Field(pattern=NAME_PATTERN)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")  # None: any JSON object
    strict: bool | None = None


class TextFormat(_Closed):
    type: Literal["text"]


class JsonObjectFormat(_Closed):
    type: Literal["json_object"]


class JsonSchemaFormat(_Closed):
    type: Literal["json_schema"]
    json_schema: JsonSchemaSpec


ResponseFormat = Annotated[
    TextFormat | JsonObjectFormat | JsonSchemaFormat, Field(discriminator="type")
]


class StructuredOutputs(_Closed):
    """vLLM's extension: exactly one of json (a schema, as an object or its text), regex, choice,
    grammar (Lark or GBNF) and json_object."""

    json_spec: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1)
    choice: Annotated[list[str], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grammar: str | None = Field(None, min_length=1)
    json_object: bool | None = None


# ---------------------------------------------------------------- tool calls in a response


class FunctionCall(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    """The first delta of a call has index, id, type, name and arguments ""; later ones the
    index and an arguments fragment (None fields are left out of the chunk)."""

    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall
