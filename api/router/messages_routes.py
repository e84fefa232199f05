"""The router's /v1/messages and /v1/messages/count_tokens (Anthropic's protocol): routed like a
chat (its prompt_cache_key, then its cached prefix), forwarded with the caller's x-api-key and
anthropic-version / anthropic-beta headers. What the router itself refuses or fails with is in
Anthropic's error shape ({"type": "error", "error": {"type", "message"}}); a failed stream ends
with Anthropic's `error` event."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api.auth import Caller, identify
from api.config import ApiConfig
from api.errors import ApiError
from api.router.forward import Outbound, forward
from api.router.lenient import json_object, messages_prompt
from api.router.prompt_ids import lenient_prompt_ids
from api.router.proxy import anthropic_error_event, forward_headers
from api.router.state import affinity_key, router_state

ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(exc: ApiError) -> JSONResponse:
    kind = ANTHROPIC_TYPES.get(exc.status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": exc.message}}
    return JSONResponse(body, exc.status)


def install_messages_routes(app: FastAPI) -> None:
    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        try:
            return await _messages(request)
        except ApiError as exc:
            return anthropic_error(exc)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        try:
            return await _messages(request, "/v1/messages/count_tokens")
        except ApiError as exc:
            return anthropic_error(exc)


async def _messages(request: Request, path: str = "/v1/messages") -> Response:
    state = router_state(request)
    caller = anthropic_caller(state.config.api, request)
    raw = await request.body()
    body = json_object(raw)
    prompt = await asyncio.to_thread(lenient_prompt_ids, state.tokenizer, messages_prompt(body))
    out = Outbound(
        "POST",
        path,
        raw,
        forward_headers(dict(request.headers)),
        affinity_key(caller, body.get("prompt_cache_key")),
        prompt,
        error_event=anthropic_error_event,
    )
    return await forward(state, out)


def anthropic_caller(config: ApiConfig, request: Request) -> Caller:
    """The caller by Anthropic's `x-api-key` header (or a Bearer key, as for the OpenAI routes)."""
    key = request.headers.get("x-api-key")
    if key and "authorization" not in request.headers:
        headers = [*request.scope["headers"], (b"authorization", f"Bearer {key}".encode())]
        request = Request({**request.scope, "headers": headers})
    return identify(config, request)
