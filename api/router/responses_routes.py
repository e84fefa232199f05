"""The router's /v1/responses: a new conversation is routed like a chat (its prompt_cache_key,
then its cached prefix); a turn that names `previous_response_id`, and a GET or DELETE of a stored
response, go to the replica that answered that response. The router learns id -> replica from
the answers it passes back (a whole Response's `id`, a stream's `response.created`).

An id the router does not know (it restarted, or forgot the id to keep its bound): with
--shared-response-store every replica can answer, so the request is routed as any other;
without, the least-loaded replica is asked first and, while a replica answers that the id is not
its own (404, or a 400 about previous_response_id), the next one."""

from __future__ import annotations

import asyncio
import json

from fastapi import FastAPI, Request
from fastapi.responses import Response

from api.auth import identify
from api.router.forward import NotHere, Outbound, forward
from api.router.lenient import json_object, responses_prompt, text_field
from api.router.prompt_ids import NO_PROMPT, lenient_prompt_ids
from api.router.proxy import forward_headers, responses_error_event
from api.router.state import RouterState, affinity_key, router_state


def install_responses_routes(app: FastAPI) -> None:
    @app.post("/v1/responses")
    async def create(request: Request) -> Response:
        state = router_state(request)
        caller = identify(state.config.api, request)
        raw = await request.body()
        body = json_object(raw)
        previous = text_field(body, "previous_response_id")
        if previous is None:
            chat = responses_prompt(body)
            prompt = await asyncio.to_thread(lenient_prompt_ids, state.tokenizer, chat)
        else:
            prompt = NO_PROMPT  # this turn's input only: not the prefix the replica will run
        out = Outbound(
            "POST",
            "/v1/responses",
            raw,
            forward_headers(dict(request.headers)),
            affinity_key(caller, body.get("prompt_cache_key")),
            prompt,
            learn_ids=True,
            error_event=responses_error_event,
            **_placement(state, previous, "previous_response_id"),
        )
        return await forward(state, out)

    @app.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str, request: Request) -> Response:
        return await _by_id(request, response_id, "GET", "")

    @app.get("/v1/responses/{response_id}/input_items")
    async def input_items(response_id: str, request: Request) -> Response:
        return await _by_id(request, response_id, "GET", "/input_items")

    @app.delete("/v1/responses/{response_id}")
    async def delete(response_id: str, request: Request) -> Response:
        return await _by_id(request, response_id, "DELETE", "")


async def _by_id(request: Request, response_id: str, method: str, suffix: str) -> Response:
    state = router_state(request)
    identify(state.config.api, request)
    query = request.url.query
    path = f"/v1/responses/{response_id}{suffix}" + (f"?{query}" if query else "")
    out = Outbound(
        method,
        path,
        b"",
        forward_headers(dict(request.headers)),
        learn_ids=method == "GET" and not suffix,
        error_event=responses_error_event,
        **_placement(state, response_id, None),
    )
    answer = await forward(state, out)
    if answer.status_code == 404 or (method == "DELETE" and answer.status_code == 200):
        state.conversations.forget(response_id)  # gone (expired, deleted, or never there)
    return answer


def _placement(state: RouterState, response_id: str | None, param: str | None) -> dict:
    """Where a request about `response_id` goes: Outbound's holder / holder_only / search."""
    if response_id is None:
        return {}
    holder = state.conversations.home(response_id)
    shared = state.config.shared_response_store
    if holder is not None:
        return {"holder": holder, "holder_only": not shared}
    return {} if shared else {"search": _not_here(response_id, param)}


def _not_here(response_id: str, param: str | None) -> NotHere:
    """Whether a replica's 4xx says that it does not hold `response_id`."""

    def check(status: int, body: bytes) -> bool:
        if status == 404:
            return True
        try:
            error = json.loads(body).get("error") or {}
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
            return False
        named = param is not None and error.get("param") == param
        return named or response_id in str(error.get("message", ""))

    return check
