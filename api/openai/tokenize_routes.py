"""POST /tokenize and /detokenize with vLLM's request and response fields (its benchmark client
asks /tokenize first): a prompt or chat messages -> token ids; token ids -> text."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

from fastapi import APIRouter, Request
from pydantic import Field, RootModel

from api.auth import identify
from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError, parse_body
from api.openai.protocol import ChatMessage, _Request, template_message
from api.openai.protocol_tools import Tools
from api.serving.input_checks import check_model, check_token_ids
from api.state import ServerState, state_of
from radixcache.shared.chat_template import ChatPrompt

router = APIRouter()


class TokenizeCompletionRequest(_Request):
    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Request):
    model: str | None = None
    messages: list[ChatMessage]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    chat_template: str | None = None
    tools: Tools | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class TokenizeRequest(RootModel[TokenizeCompletionRequest | TokenizeChatRequest]):
    """The /tokenize body as the OpenAPI document states it (the route picks the variant)."""


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]] = Field(max_length=1 << 20)


def _chat_text(templates: ChatTemplates, req: TokenizeChatRequest) -> str:
    if req.continue_final_message and req.add_generation_prompt:
        raise ApiError(
            400,
            "Cannot set both 'continue_final_message' and 'add_generation_prompt' to true",
            param="continue_final_message",
        )
    if req.chat_template is not None:
        raise ApiError(
            400, "This server uses the model's chat template only", param="chat_template"
        )
    if not req.messages:
        raise ApiError(400, "The messages are empty", param="messages")
    messages = [template_message(m) for m in req.messages]
    tools = [t.model_dump(exclude_none=True) for t in req.tools] if req.tools else None
    prompt = ChatPrompt(messages, tools, dict(req.chat_template_kwargs or {}))
    try:
        text = templates.render(prompt, add_generation_prompt=req.add_generation_prompt)
    except TemplateError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc
    if req.continue_final_message:  # cut what the template adds after the last message
        last = messages[-1]["content"]
        end = text.rfind(last) if last else -1
        if end < 0:
            raise ApiError(400, "The final message is not in the rendered chat", param="messages")
        text = text[: end + len(last)]
    return text


def _tokenize(state: ServerState, body: bytes) -> dict[str, Any]:
    try:
        is_chat = isinstance(data := json.loads(body), dict) and "messages" in data
    except (json.JSONDecodeError, UnicodeDecodeError):
        is_chat = False  # parse_body explains the error
    req: TokenizeChatRequest | TokenizeCompletionRequest
    tok = state.engine.tokenizer
    if is_chat:
        req = parse_body(body, TokenizeChatRequest)
        text, special = _chat_text(state.templates, req), req.add_special_tokens
    else:
        req = parse_body(body, TokenizeCompletionRequest)
        text, special = req.prompt, req.add_special_tokens
    if req.model is not None:
        check_model(req.model, state.served_names)
    ids = list(tok.encode(text, add_special_tokens=special))
    strs = [tok.backend.id_to_token(i) for i in ids] if req.return_token_strs else None
    return {
        "count": len(ids),
        "max_model_len": state.engine.max_model_len,
        "tokens": ids,
        "token_strs": strs,
    }


def _detokenize(state: ServerState, body: bytes) -> dict[str, Any]:
    req = parse_body(body, DetokenizeRequest)
    if req.model is not None:
        check_model(req.model, state.served_names)
    tok = state.engine.tokenizer
    check_token_ids(req.tokens, tok.vocab_size, param="tokens")
    return {"prompt": tok.decode(req.tokens, skip_special_tokens=False)}


@router.post("/tokenize")
async def tokenize(request: Request) -> dict[str, Any]:
    state = state_of(request)
    identify(state.config, request)
    return await asyncio.to_thread(_tokenize, state, await request.body())


@router.post("/detokenize")
async def detokenize(request: Request) -> dict[str, Any]:
    state = state_of(request)
    identify(state.config, request)
    return await asyncio.to_thread(_detokenize, state, await request.body())
