"""/v1/responses: create (whole or streamed), retrieve and delete. A turn's prompt is the stored
conversation of `previous_response_id` (its items; its instructions are not carried over, as in
OpenAI) and the new input, rendered by the chat template; the one request builder makes its job.
With `store` (the default) the conversation, as items and token ids, is kept for the next turn,
visible only to its caller's tenant."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from api.auth import Caller, identify
from api.errors import ApiError, parse_body
from api.openai.responses.answer import Answer, settings_of
from api.openai.responses.conversation import prompt_ids
from api.openai.responses.events import response_events
from api.openai.responses.items import chat_prompt, item_dicts
from api.openai.responses.output import OutputWriter
from api.openai.responses.protocol import ResponsesRequest
from api.openai.responses.spec import responses_spec, tool_plan_of
from api.openai.responses.store import ResponseStore, StoredResponse
from api.serving.engine_errors import raise_if_failed
from api.serving.input_checks import check_model
from api.serving.job_streams import (
    ClientDisconnected,
    RunningJobs,
    collect_final,
    start_request,
)
from api.serving.request_builder import GenerationSpec
from api.serving.respond import respond
from api.state import ServerState, state_of
from engine.outputs import RequestResult

router = APIRouter()
T = TypeVar("T")


def _store(state: ServerState) -> ResponseStore:
    if state.responses is None:
        raise ApiError(503, "This server keeps no responses", code="no_response_store")
    return state.responses


async def _in_store(call: Callable[..., T], *args: Any) -> T:
    """A store call off the event loop; a store that fails (down, closed) is a 503."""
    try:
        return await asyncio.to_thread(call, *args)
    except ApiError:
        raise  # the store's own 503 (store_redis.ResponseStoreUnavailable)
    except Exception as exc:
        message = f"The response store failed: {type(exc).__name__}: {exc}"
        raise ApiError(503, message, code="store_unavailable") from exc


async def _owned(state: ServerState, caller: Caller, response_id: str) -> StoredResponse | None:
    """The record, if it exists and is the caller's tenant's."""
    record = await _in_store(_store(state).get, response_id)
    if record is None or record.tenant != caller.tenant:
        return None
    return record


def _not_found(response_id: str) -> ApiError:
    return ApiError(404, f"Response with id '{response_id}' not found.", code="not_found")


async def _earlier(
    state: ServerState, caller: Caller, req: ResponsesRequest
) -> StoredResponse | None:
    if req.previous_response_id is None:
        return None
    record = await _owned(state, caller, req.previous_response_id)
    if record is None:
        raise ApiError(
            400,
            f"Previous response with id '{req.previous_response_id}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return record


@router.post("/v1/responses")
async def create_response(request: Request) -> Response:
    state = state_of(request)
    caller = identify(state.config, request)
    req = parse_body(await request.body(), ResponsesRequest)
    check_model(req.model, state.served_names)
    earlier = await _earlier(state, caller, req)
    conversation = (earlier.conversation if earlier is not None else []) + item_dicts(req.items())
    prompt = chat_prompt(req.instructions, conversation, req.tools)
    plan = tool_plan_of(req, state.templates, state.config.tool_call_parser, prompt)
    reused = earlier.token_ids if earlier is not None else []
    tokenizer = state.engine.tokenizer
    ids = await asyncio.to_thread(prompt_ids, tokenizer, state.templates, prompt, reused)
    running = await _start(state, responses_spec(req, ids, plan), caller)
    answer = Answer(req.model, settings_of(req))
    writer = OutputWriter(plan)

    async def finish(body: dict[str, Any], result: RequestResult) -> None:
        """Keeps the conversation (this turn's output items appended) and its token ids."""
        if not req.store:
            return
        output = [item.model_dump(mode="json") for item in writer.items]
        ids = result.prompt_token_ids + [t for c in result.outputs for t in c.token_ids]
        record = StoredResponse(
            answer.id, caller.tenant, answer.created_at, body, conversation + output, ids
        )
        await _in_store(_store(state).put, record)

    if req.stream:
        events = response_events(running, answer, writer, finish)
        return await respond(request, state, running, events, lambda _: {})
    try:
        finals = await collect_final(running, request)
    except ClientDisconnected:
        state.metrics.requests.labels(request.url.path, "disconnected").inc()
        return Response(status_code=499)
    result = finals[0]
    for c in result.outputs:
        raise_if_failed(c)
        writer.feed(c.text, True, c.finish_reason == "length")
    body = answer.finished(writer.items, result)
    await finish(body, result)
    state.metrics.requests.labels(request.url.path, "ok").inc()
    return JSONResponse(body)


_PARAMS = {"max_tokens": "max_output_tokens", "prompt": "input"}  # the builder's names -> ours


async def _start(state: ServerState, spec: GenerationSpec, caller: Caller) -> RunningJobs:
    try:
        return await start_request(state, spec, caller)
    except ApiError as exc:
        exc.param = _PARAMS.get(exc.param or "", exc.param)
        exc.message = exc.message.replace("max_tokens", "max_output_tokens")
        raise


@router.get("/v1/responses/{response_id}")
async def retrieve_response(response_id: str, request: Request) -> JSONResponse:
    state = state_of(request)
    caller = identify(state.config, request)
    record = await _owned(state, caller, response_id)
    if record is None:
        raise _not_found(response_id)
    return JSONResponse(record.body)


@router.delete("/v1/responses/{response_id}")
async def delete_response(response_id: str, request: Request) -> JSONResponse:
    state = state_of(request)
    caller = identify(state.config, request)
    store = _store(state)
    if await _owned(state, caller, response_id) is None:
        raise _not_found(response_id)
    await _in_store(store.delete, response_id)
    return JSONResponse({"id": response_id, "object": "response", "deleted": True})
