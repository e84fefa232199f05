"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions. Each route
parses its request, maps it onto a GenerationSpec (request_specs.py), has the one builder make
the engine's jobs, and answers with the one choice renderer (choices.py), whole or streamed."""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response

from api.auth import Caller, identify
from api.errors import parse_body
from api.openai.choices import ChatChoices, ChoiceShape, CompletionChoices, usage_of
from api.openai.protocol import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    dump,
    now,
)
from api.openai.request_specs import chat_spec, completion_spec
from api.openai.streams import ResponseHead, chat_events, completion_events
from api.serving.input_checks import check_model
from api.serving.job_streams import start_request
from api.serving.request_builder import new_id
from api.serving.respond import respond
from api.state import ServerState, state_of
from engine.outputs import RequestResult

router = APIRouter()
R = TypeVar("R", CompletionRequest, ChatCompletionRequest)


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    state = state_of(request)
    identify(state.config, request)
    cards = [
        ModelCard(id=name, created=int(state.started_at), max_model_len=state.engine.max_model_len)
        for name in state.served_names
    ]
    return ModelList(data=cards)


async def _parse(request: Request, model: type[R]) -> tuple[ServerState, Caller, R]:
    """The server, the caller (401 without a valid key) and the request (400 if malformed, 404
    for a model not served)."""
    state = state_of(request)
    caller = identify(state.config, request)
    req = parse_body(await request.body(), model)
    check_model(req.model, state.served_names)
    return state, caller, req


def _head(req: CompletionRequest | ChatCompletionRequest, prefix: str) -> ResponseHead:
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return ResponseHead(new_id(prefix), now(), req.model, include_usage)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state, caller, req = await _parse(request, CompletionRequest)
    spec = completion_spec(req)
    running = await start_request(state, spec, caller)
    tok = state.engine.tokenizer
    shape = ChoiceShape(req.n, req.logprobs is not None, req.return_token_ids)
    echo = [p if isinstance(p, str) else tok.decode(p) for p in req.prompts()] if req.echo else None
    choices = CompletionChoices(tok, shape, echo)
    head = _head(req, "cmpl")

    def build(finals: list[RequestResult]) -> dict:
        rendered = [c for j, out in enumerate(finals) for c in choices.whole(j, out)]
        body = CompletionResponse(
            id=head.request_id,
            created=head.created,
            model=req.model,
            choices=rendered,
            usage=usage_of(finals),
        )
        return dump(body)

    events = completion_events(running, head, choices) if req.stream else None
    return await respond(request, state, running, events, build)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state, caller, req = await _parse(request, ChatCompletionRequest)
    spec, plan = chat_spec(req, state.templates, state.config.tool_call_parser)
    running = await start_request(state, spec, caller)
    shape = ChoiceShape(req.n, req.logprobs, req.return_token_ids)
    choices = ChatChoices(state.engine.tokenizer, shape, plan)
    head = _head(req, "chatcmpl")

    def build(finals: list[RequestResult]) -> dict:
        body = ChatCompletionResponse(
            id=head.request_id,
            created=head.created,
            model=req.model,
            choices=choices.whole(finals[0]),
            usage=usage_of(finals),
        )
        return dump(body)

    events = chat_events(running, head, choices) if req.stream else None
    return await respond(request, state, running, events, build)
