"""The router's /v1/messages and /v1/messages/count_tokens (Anthropic's protocol): routed like a
chat (its metadata.user_id as the affinity key, then its cached prefix), forwarded with the caller's x-api-key and
anthropic-version / anthropic-beta headers. What the router itself refuses or fails with is in
Anthropic's error shape ({"type": "error", "error": {"type", "message"}}); a failed stream ends
with Anthropic's `error` event."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import Response

from api.anthropic.errors import error_response
from api.auth import identify
from api.errors import ApiError
from api.router.forward import Outbound, forward
from api.router.lenient import json_object, messages_prompt
from api.router.prompt_ids import lenient_prompt_ids
from api.router.proxy import anthropic_error_event, forward_headers
from api.router.state import affinity_key, router_state


def install_messages_routes(app: FastAPI) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        try:
            return await _messages(request)
        except ApiError as exc:
            return error_response(exc)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            return await _messages(request, "/v1/messages/count_tokens")
        except ApiError as exc:
            return error_response(exc)


async def _messages(request: Request, path: str = "/v1/messages") -> Response:
    state = router_state(request)
    caller = identify(state.config.api, request)  # x-api-key or a Bearer key
    raw = await request.body()
    body = json_object(raw)
    prompt = await asyncio.to_thread(lenient_prompt_ids, state.tokenizer, messages_prompt(body))
    out = Outbound(
        "POST",
        path,
        raw,
        forward_headers(dict(request.headers)),
        affinity_key(caller, _user_id(body)),
        prompt,
        error_event=anthropic_error_event,
    )
    return await forward(state, out)


def _user_id(body: dict) -> object:
    """The affinity key of a Messages request: Anthropic's `metadata.user_id` (the protocol has
    no prompt_cache_key), so one user's conversation stays on one replica while its load allows."""
    metadata = body.get("metadata")
    return metadata.get("user_id") if isinstance(metadata, dict) else None
