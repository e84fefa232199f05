"""OpenAI-compatible endpoints: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

from api.auth import identify
from api.chat_template import ChatTemplates, TemplateError
from api.errors import ApiError, parse_body
from api.openai.logprobs import (
    chat_logprobs,
    completion_logprobs,
    finish_reason,
    raise_if_failed,
    usage_of,
)
from api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    dump,
    new_id,
    now,
)
from api.openai.streams import EventStream, StreamContext, chat_events, completion_events
from api.openai.tool_parsers import format_of_template
from api.openai.tool_plan import ToolPlan, logit_bias_of, output_constraint, tool_plan
from api.openai.tool_stream import split_whole
from api.serving.input_checks import (
    check_model,
    encode_prompt,
    prepare_constraint,
    resolve_max_tokens,
    to_sampling_params,
)
from api.serving.job_streams import ClientDisconnected, Timing, collect_final, open_streams
from api.state import ServerState, state_of
from engine.outputs import Completion, RequestResult
from engine.request import GenerateJob, Prompt
from radixcache.chat_template import ChatPrompt

router = APIRouter()

MAX_BATCH_PROMPTS = 64
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


# formats whose markers are special tokens in their models' vocabularies: kept in the text
SPECIAL = frozenset({"mistral", "llama3_json"})


def _tool_format(state: ServerState, prompt: ChatPrompt) -> str:
    if state.config.tool_call_parser is not None:
        return state.config.tool_call_parser
    try:
        return format_of_template(state.templates.source_for(prompt))
    except TemplateError as exc:
        raise ApiError(400, str(exc), param=exc.param) from exc


def _constraint_param(req: Any) -> str:
    return "structured_outputs" if req.structured_outputs is not None else "response_format"


@router.get("/v1/models")
async def list_models(request: Request) -> ModelList:
    state = state_of(request)
    identify(state.config, request)
    cards = [
        ModelCard(id=name, created=int(state.started_at), max_model_len=state.engine.max_model_len)
        for name in state.served_names
    ]
    return ModelList(data=cards)


def _chat_prompt_ids(
    engine: AsyncEngine, templates: ChatTemplates, prompt: ChatPrompt
) -> list[int]:
    """The one rendering of the server, the router and the engine (radixcache/chat_template.py,
    through api/chat_template.py), then the tokenizer."""
    try:
        text = templates.render(prompt)
    except TemplateError as exc:  # template errors are the request's fault (roles, order)
        raise ApiError(400, str(exc), param=exc.param) from exc
    ids = list(engine.tokenizer.encode(text, add_special_tokens=False))
    if not ids:
        raise ApiError(400, "The messages produce an empty prompt", param="messages")
    return ids


Events = Callable[[StreamContext, Any], AsyncIterator[str]]


async def _run(
    request: Request,
    state: ServerState,
    stream_ctx: StreamContext,
    events: Events | None,
    build: Callable[[list[RequestResult]], BaseModel],
) -> Response:
    """Streams `events`, or waits for every job and answers `build(results)`."""
    if events is not None:

        def on_close() -> None:
            state.metrics.requests.labels(request.url.path, "stream").inc()

        return EventStream(events(stream_ctx, state.engine.tokenizer), on_close)
    try:
        finals = await collect_final(stream_ctx.streams, stream_ctx.timing, request)
        stream_ctx.timing.finish()
    except ClientDisconnected:
        state.metrics.requests.labels(request.url.path, "disconnected").inc()
        return Response(status_code=499)
    state.metrics.requests.labels(request.url.path, "ok").inc()
    return JSONResponse(dump(build(finals)))


def _context(
    state: ServerState,
    req: Any,
    jobs: list[GenerateJob],
    prefix: str,
    logprobs: bool,
    tools: ToolPlan | None = None,
) -> StreamContext:
    """Admits the jobs (429 when the queue is full) and describes the response to build."""
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    return StreamContext(
        streams=open_streams(state.engine, jobs, state.metrics),
        timing=Timing(state.metrics),
        request_id=new_id(prefix),
        created=now(),
        model=req.model,
        n=req.n,
        include_usage=include_usage,
        logprobs=logprobs,
        token_ids=req.return_token_ids,
        tools=tools,
    )


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    state = state_of(request)
    caller = identify(state.config, request)
    req = parse_body(await request.body(), CompletionRequest)
    check_model(req.model, state.served_names)
    engine = state.engine
    prompts = req.prompts()
    if not prompts:
        raise ApiError(400, "The prompt is empty", param="prompt", code="empty_prompt")
    if len(prompts) > MAX_BATCH_PROMPTS:
        raise ApiError(400, f"At most {MAX_BATCH_PROMPTS} prompts per request", param="prompt")
    salt = caller.cache_salt(req.cache_salt)
    constraint = output_constraint(req)
    bias = logit_bias_of(req, engine.tokenizer.vocab_size)
    await prepare_constraint(engine, constraint, _constraint_param(req))
    jobs = []
    for prompt in prompts:
        ids = await asyncio.to_thread(encode_prompt, engine.tokenizer, prompt)  # off the loop
        max_tokens = resolve_max_tokens(
            req.max_tokens, len(ids), engine.max_model_len, COMPLETION_DEFAULT_MAX_TOKENS
        )
        params = to_sampling_params(req, max_tokens, req.logprobs, constraint, bias)
        text = prompt if isinstance(prompt, str) else None
        jobs.append(GenerateJob(new_id("cmpl"), Prompt(ids, text), params, salt))
    ctx = _context(state, req, jobs, "cmpl", req.logprobs is not None)
    tok = engine.tokenizer
    if req.echo:
        ctx.echo = [p if isinstance(p, str) else tok.decode(p) for p in prompts]

    def build(finals: list[RequestResult]) -> CompletionResponse:
        choices = []
        for j, out in enumerate(finals):
            head = ctx.echo[j] if ctx.echo else ""
            for c in out.outputs:
                raise_if_failed(c)
                lp = completion_logprobs(tok, c, len(head))
                choices.append(
                    CompletionChoice(
                        index=j * req.n + c.index,
                        text=head + c.text,
                        logprobs=lp if ctx.logprobs else None,
                        finish_reason=finish_reason(c.finish_reason),
                        prompt_token_ids=out.prompt_token_ids if req.return_token_ids else None,
                        token_ids=c.token_ids if req.return_token_ids else None,
                    )
                )
        return CompletionResponse(
            id=ctx.request_id,
            created=ctx.created,
            model=req.model,
            choices=choices,
            usage=usage_of(finals),
        )

    return await _run(request, state, ctx, completion_events if req.stream else None, build)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    state = state_of(request)
    caller = identify(state.config, request)
    req = parse_body(await request.body(), ChatCompletionRequest)
    check_model(req.model, state.served_names)
    engine = state.engine
    prompt = req.chat_prompt()
    plan = tool_plan(req, _tool_format(state, prompt) if req.tools else "hermes")
    constraint = output_constraint(req)
    if plan is not None and plan.forced:
        if constraint is not None:
            raise ApiError(
                400,
                "tool_choice 'required' or a named function cannot be combined with an output "
                "format (response_format / structured_outputs)",
                param="tool_choice",
            )
        constraint = plan.constraint
    ids = await asyncio.to_thread(_chat_prompt_ids, engine, state.templates, prompt)
    requested = req.max_completion_tokens or req.max_tokens
    max_tokens = resolve_max_tokens(requested, len(ids), engine.max_model_len, None)
    top = (req.top_logprobs or 0) if req.logprobs else None
    bias = logit_bias_of(req, engine.tokenizer.vocab_size)
    keep_special = plan is not None and plan.parser is not None and plan.parser.name in SPECIAL
    params = to_sampling_params(req, max_tokens, top, constraint, bias, not keep_special)
    param = "tool_choice" if plan is not None and plan.forced else _constraint_param(req)
    await prepare_constraint(engine, constraint, param)
    jobs = [GenerateJob(new_id("chatcmpl"), Prompt(ids), params, caller.cache_salt(req.cache_salt))]
    ctx = _context(state, req, jobs, "chatcmpl", req.logprobs, plan)
    tok = engine.tokenizer

    def choice_of(out: RequestResult, c: Completion) -> ChatChoice:
        raise_if_failed(c)
        content: str | None = c.text
        calls = None
        if plan is not None and plan.parser is not None:
            content, calls = split_whole(plan.parser, plan.parallel, c.text)
        return ChatChoice(
            index=c.index,
            message=AssistantMessage(content=content, tool_calls=calls or None),
            logprobs=chat_logprobs(tok, c) if req.logprobs else None,
            finish_reason=finish_reason(c.finish_reason, bool(calls)),
            prompt_token_ids=out.prompt_token_ids if req.return_token_ids else None,
            token_ids=c.token_ids if req.return_token_ids else None,
        )

    def build(finals: list[RequestResult]) -> ChatCompletionResponse:
        out = finals[0]
        choices = [choice_of(out, c) for c in out.outputs]
        return ChatCompletionResponse(
            id=ctx.request_id,
            created=ctx.created,
            model=req.model,
            choices=choices,
            usage=usage_of(finals),
        )

    return await _run(request, state, ctx, chat_events if req.stream else None, build)
