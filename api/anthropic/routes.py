"""POST /v1/messages: Anthropic's Messages API (and /v1/messages/count_tokens). The request is parsed (closed models), its
conversation rendered and tokenized once with its cache_control breakpoints located
(breakpoints.py), mapped onto a GenerationSpec (token ids, sampling, forced tool calls), built and
admitted by the one builder, and answered whole (content.py) or streamed (events.py). Once the
job finished, each breakpoint's prefix is pinned for its TTL (api/serving/pin_leases.py), in the
caller's namespace. Every error is in Anthropic's shape (errors.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable
from dataclasses import dataclass
from datetime import date
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.anthropic.breakpoints import Breakpoint, locate, marks, prompt_ids
from api.anthropic.content import Reply
from api.anthropic.errors import as_error, error_response
from api.anthropic.events import message_events
from api.anthropic.prompt import conversation, openai_tool, openai_tool_choice
from api.anthropic.protocol import CountTokensRequest, MessagesRequest, TokenCount
from api.auth import Caller, identify
from api.body_limit import BodyTooLarge
from api.errors import ApiError, parse_body
from api.openai.tool_plan import ToolPlan, plan_tools
from api.serving.input_checks import check_model
from api.serving.job_streams import start_request
from api.serving.request_builder import GenerationSpec
from api.serving.respond import respond
from api.state import ServerState, state_of
from engine.outputs import RequestResult

log = logging.getLogger("radixcache.api")
router = APIRouter()
R = TypeVar("R", CountTokensRequest, MessagesRequest)

FIRST_VERSION = "2023-01-01"  # anthropic-version: a date, the first one Anthropic dated
# betas whose features are served without the header (now part of the API)
BETAS = frozenset({"prompt-caching-2024-07-31", "extended-cache-ttl-2025-04-11"})


@dataclass(frozen=True)
class Prepared:
    """A request in the engine's terms: its prompt, breakpoints and tools."""

    token_ids: list[int]
    breakpoints: list[Breakpoint]
    plan: ToolPlan | None


@router.post("/v1/messages")
async def create_message(request: Request) -> Response:
    return await _answer(_create(request))


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request) -> Response:
    return await _answer(_count(request))


async def _answer(work: Awaitable[Response]) -> Response:
    """The route's response, or its failure in Anthropic's shape."""
    try:
        return await work
    except BodyTooLarge:  # the body limit's own 413 (api/body_limit.py)
        raise
    except Exception as exc:
        err = as_error(exc)
        if err.status >= 500:
            log.exception("/v1/messages failed", exc_info=exc)
        return error_response(err)


def check_headers(request: Request) -> None:
    """anthropic-version is required (as Anthropic); any dated version from the first on is
    served the same (the fields served here mean the same in each, and the official clients
    send their own newer dates); an anthropic-beta we do not serve is refused by name."""
    version = request.headers.get("anthropic-version")
    if version is None:
        raise ApiError(400, "anthropic-version: header is required")
    if not _is_date(version) or version < FIRST_VERSION:
        raise ApiError(400, f"anthropic-version: invalid version {version!r} (e.g. 2023-06-01)")
    betas = [b.strip() for b in request.headers.get("anthropic-beta", "").split(",") if b.strip()]
    unknown = [b for b in betas if b not in BETAS]
    if unknown:
        raise ApiError(400, f"anthropic-beta: this server does not serve {unknown}")


def _is_date(text: str) -> bool:
    try:
        return date.fromisoformat(text).isoformat() == text
    except ValueError:
        return False


async def _parse(request: Request, model: type[R]) -> tuple[ServerState, Caller, R]:
    state = state_of(request)
    caller = identify(state.config, request)
    check_headers(request)
    req = parse_body(await request.body(), model)
    check_model(req.model, state.served_names)
    return state, caller, req


async def _count(request: Request) -> Response:
    """The prompt's tokens as the request would render them (tools, system and messages)."""
    state, _, req = await _parse(request, CountTokensRequest)
    prepared = await asyncio.to_thread(prepare, state, req)
    return JSONResponse(TokenCount(input_tokens=len(prepared.token_ids)).model_dump())


async def _create(request: Request) -> Response:
    state, caller, req = await _parse(request, MessagesRequest)
    prepared = await asyncio.to_thread(prepare, state, req)
    spec = generation_spec(req, prepared)
    running = await start_request(state, spec, caller)
    reply = Reply(
        message_id=f"msg_{uuid.uuid4().hex[:24]}",
        model=req.model,
        plan=prepared.plan,
        stops=tuple(req.stop_sequences or ()),
        breakpoints=prepared.breakpoints,
        tokenizer=state.engine.tokenizer,
    )
    salt = caller.cache_salt(None)

    async def settle(results: list[RequestResult]) -> None:
        await pin_breakpoints(state, salt, prepared, results)

    def build(finals: list[RequestResult]) -> dict:
        return reply.message(finals[0]).model_dump()

    events = message_events(running, reply, settle) if req.stream else None
    return await respond(request, state, running, events, build, settle=settle)


def prepare(state: ServerState, req: CountTokensRequest) -> Prepared:
    """Blocking (render, tokenize): run it off the event loop."""
    tokenizer, templates = state.engine.tokenizer, state.templates
    conv = conversation(req)
    found = marks(req)
    ids = prompt_ids(tokenizer, templates, conv)
    breakpoints = locate(tokenizer, templates, ids, found)
    tools = [openai_tool(t) for t in req.tools or ()]
    choice, parallel = openai_tool_choice(req)
    configured = state.config.tool_call_parser
    plan = plan_tools(tools, choice, parallel, configured, templates, conv.chat_prompt())
    return Prepared(ids, breakpoints, plan)


def generation_spec(req: MessagesRequest, prepared: Prepared) -> GenerationSpec:
    plan = prepared.plan
    keep_special = plan is not None and plan.keeps_special_tokens
    sampling = dict(
        n=1,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=tuple(req.stop_sequences or ()),
        skip_special_tokens=not keep_special,
    )
    return GenerationSpec(
        id_prefix="msg",
        prompts=(prepared.token_ids,),
        sampling=sampling,
        constraint=plan.constraint if plan is not None else None,
        max_tokens=req.max_tokens,
        constraint_param="tool_choice",
    )


async def pin_breakpoints(
    state: ServerState, salt: str, prepared: Prepared, results: list[RequestResult]
) -> None:
    """Once the job finished (its prompt computed and cached), each breakpoint's prefix is held
    for its TTL, or its lease extended."""
    leases = state.pin_leases
    if leases is None or not results or not results[0].finished:
        return
    ids = prepared.token_ids
    for b in prepared.breakpoints:
        if b.tokens > 0:
            await asyncio.to_thread(leases.hold, salt, ids[: b.tokens], b.ttl_s)
