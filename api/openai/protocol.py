"""OpenAI-compatible request and response models (the subset radixcache serves).

Requests are parsed from raw JSON in strict mode: a number sent as a string is a 400, as in OpenAI.
They are closed: a field we receive and do not honour is a 400 naming it, never a silent 200. The
allow-list of harmless fields accepted and ignored: `user`, `store`, `metadata` (OpenAI-side
bookkeeping), `service_tier` (a billing tier: one server has one) and `refusal` in an assistant
message (what the client echoes back of our own answer). Tools and output formats:
protocol_tools.py. What only the model can check (vocabulary, context window, max_tokens
ceiling): api/serving/input_checks.py.
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from api.openai.protocol_tools import (
    DeltaToolCall,
    MessageToolCall,
    ResponseFormat,
    StructuredOutputs,
    ToolCall,
    ToolChoice,
    Tools,
)
from radixcache.shared.chat_template import ChatPrompt

MAX_N = 16
MAX_STOP = 16
MAX_LOGIT_BIAS = 300  # entries, as OpenAI
MAX_PROMPT_CACHE_KEY = 256  # characters


def _integral(value: Any) -> Any:
    """JSON Schema counts 1.0 as an integer: take it as 1 (1.5 and "1" still fail strict int)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# an integer request field: strict, but integral floats accepted, as the schema promises
Int = Annotated[int, BeforeValidator(_integral)]
TokenId = Annotated[Int, Field(ge=0)]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


class StreamOptions(_Request):
    include_usage: bool = False


class _SamplingFields(_Request):
    model: str = Field(min_length=1)
    max_tokens: Int | None = Field(None, ge=1)  # and at most the context window left
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(0, ge=-1)  # 0 or -1: off
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    n: Int = Field(1, ge=1, le=MAX_N)
    seed: Int | None = None
    stop: str | Annotated[list[str], Field(max_length=MAX_STOP)] | None = None
    stop_token_ids: list[TokenId] | None = Field(None, max_length=MAX_STOP)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=2.0)
    ignore_eos: bool = False
    stream: bool = False
    stream_options: StreamOptions | None = None
    cache_salt: str | None = Field(None, max_length=256)
    # a routing and analytics label grouping requests that share a prefix (it never isolates)
    prompt_cache_key: str | None = Field(None, max_length=MAX_PROMPT_CACHE_KEY)
    # 24h: the prompt's prefix is kept in the persistent tier (disk or Redis) for 24 hours
    prompt_cache_retention: Literal["in_memory", "24h"] | None = None
    user: str | None = None  # allow-listed: accepted, ignored
    store: bool | None = None  # allow-listed: accepted, ignored (nothing is stored)
    metadata: dict[str, str] | None = None  # allow-listed: accepted, ignored
    service_tier: str | None = None  # allow-listed: accepted, ignored
    return_token_ids: bool = False  # extension (as in vLLM): token ids in the choices
    # token id (as a string) -> bias added to its logit before anything else, as OpenAI
    logit_bias: (
        Annotated[
            dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]],
            Field(max_length=MAX_LOGIT_BIAS),
        ]
        | None
    ) = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None  # extension (as in vLLM)

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop if s]


Text = Annotated[str, Field(min_length=1)]
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
PromptType = (
    Text
    | Annotated[list[Text], Field(min_length=1)]
    | TokenIds
    | Annotated[list[TokenIds], Field(min_length=1)]
)


class CompletionRequest(_SamplingFields):
    prompt: PromptType
    logprobs: Int | None = Field(None, ge=0, le=20)
    echo: bool = False

    def prompts(self) -> list[str | list[int]]:
        """The prompt as a list of single prompts (OpenAI allows a batch)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return []
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class TextPart(_Request):
    type: Literal["text"]
    text: str


class ChatMessage(_Request):
    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this result answers
    refusal: str | None = None  # allow-listed: accepted, ignored

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=20)

    tools: Tools | None = None
    tool_choice: ToolChoice | None = None  # default: "auto" with tools, else "none"
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None  # extra template variables (as vLLM)

    def chat_messages(self) -> list[dict[str, Any]]:
        return [template_message(m) for m in self.messages]

    def chat_prompt(self) -> ChatPrompt:
        """What the chat template renders (the same for the server and the router)."""
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        return ChatPrompt(self.chat_messages(), tools, dict(self.chat_template_kwargs or {}))


def _template_arguments(text: str) -> Any:
    """Templates want a call's arguments as an object (vLLM and transformers hand them so)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text


def template_message(m: ChatMessage) -> dict[str, Any]:
    """A message as chat templates read it: content text ("" when absent, except an assistant
    message of calls only, where it stays None), and its calls or the call it answers."""
    out: dict[str, Any] = {"role": m.role}
    out["content"] = None if m.content is None and m.tool_calls else m.text()
    if m.tool_calls:
        out["tool_calls"] = [
            {
                "id": c.id,
                "type": c.type,
                "function": {
                    "name": c.function.name,
                    "arguments": _template_arguments(c.function.arguments),
                },
            }
            for c in m.tool_calls
        ]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    if m.role == "tool" and m.name is not None:
        out["name"] = m.name
    return out


class LookupRequest(_Request):
    """Exactly one of `prompt` and `messages` (with the chat's tools: they are in its prompt)."""

    model: str | None = None
    prompt: str | TokenIds | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    tools: Tools | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = Field(None, max_length=256)

    def chat_prompt(self) -> ChatPrompt:
        tools = [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None
        messages = [template_message(m) for m in self.messages or ()]
        return ChatPrompt(messages, tools, dict(self.chat_template_kwargs or {}))


class PinRequest(LookupRequest):
    pass


# ---------------------------------------------------------------- responses


def now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails = PromptTokensDetails()


class CompletionLogprobs(BaseModel):
    tokens: list[str] = []
    token_logprobs: list[float | None] = []
    top_logprobs: list[dict[str, float] | None] = []
    text_offset: list[int] = []


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids only
    token_ids: list[int] | None = None  # return_token_ids only


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = []


class ChatLogprobs(BaseModel):
    content: list[TokenLogprob] | None = None


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None  # left out when there are none


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids only
    token_ids: list[int] | None = None  # return_token_ids only


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage | None = None


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None  # left out when there are none


class ChatChunkChoice(BaseModel):
    index: int
    delta: Delta
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # return_token_ids only


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "radixcache"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


_EXTENSIONS = ("prompt_token_ids", "token_ids")


def dump(model: BaseModel) -> dict[str, Any]:
    """JSON-ready dict: standard fields always present (null included), extensions only if set."""
    data = model.model_dump()
    for choice in data.get("choices", ()):
        for key in _EXTENSIONS:
            if choice.get(key) is None:
                choice.pop(key, None)
        for key in ("message", "delta"):
            if key in choice:
                _drop_empty_calls(choice[key])
    return data


def _drop_empty_calls(message: dict[str, Any]) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        message.pop("tool_calls", None)
        return
    for call in calls:  # a streamed call's later deltas carry only index and arguments
        for k in [k for k, v in call.items() if v is None]:
            del call[k]
        fn = call.get("function") or {}
        for k in [k for k, v in fn.items() if v is None]:
            del fn[k]
