"""The router's FastAPI app: the OpenAI and Anthropic routes proxied to the chosen replica,
/health, /v1/models and /v1/router/stats. Replicas, subscribers and the HTTP client live in the
lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api.anthropic.errors import error_body as anthropic_error_body
from api.auth import identify
from api.body_limit import BodyLimitMiddleware
from api.errors import ApiError, install_error_handlers, parse_body
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.router.affinity import key_affinity
from api.router.config import RouterConfig
from api.router.conversations import response_homes
from api.router.discovery import Discovery
from api.router.forward import REPLICA_HEADER, Outbound, forward
from api.router.messages_routes import install_messages_routes
from api.router.policy import Router
from api.router.prompt_ids import request_prompt_ids
from api.router.proxy import forward_headers
from api.router.replicas import build_replicas
from api.router.responses_routes import install_responses_routes
from api.router.state import RouterState, affinity_key, check_health, health_forever, router_state
from api.router.tokenize import PromptTokenizer

__all__ = ["REPLICA_HEADER", "create_router_app"]
log = logging.getLogger("radixcache.router")


def create_router_app(config: RouterConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        tokenizer = await asyncio.to_thread(PromptTokenizer, config.tokenizer)
        if not tokenizer.segments.segmented:
            reasons = "; ".join(tokenizer.segments.blockers)
            log.warning("the router tokenizes each prompt whole: %s", reasons)
        replicas = build_replicas(list(config.replicas), config.index_blocks, config.block_size)
        timeout = httpx.Timeout(config.read_timeout_s, connect=config.connect_timeout_s)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        client = httpx.AsyncClient(timeout=timeout, limits=limits)
        state = RouterState(
            config,
            replicas,
            Router(config.policy, config.balance),
            tokenizer,
            client,
            key_affinity(config.affinity_keys),
            response_homes(config.response_ids),
        )
        for r in replicas:
            if r.subscriber is not None:
                r.subscriber.start()
        tasks = [health_forever(state)]
        if config.replicas_dns is not None:
            state.discovery = Discovery(config.replicas_dns)
            await state.discovery.sync(state)
            tasks.append(state.discovery.forever(state))
        await check_health(state)
        app.state.router = state
        running = [asyncio.create_task(t) for t in tasks]
        try:
            yield
        finally:
            for task in running:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            app.state.router = None
            await client.aclose()
            for r in state.replicas:
                if r.subscriber is not None:
                    await asyncio.to_thread(r.subscriber.close)

    app = FastAPI(title="radixcache router", version="0.1.0", lifespan=lifespan)
    app.state.router = None
    shapes = {"/v1/messages": anthropic_error_body}  # Anthropic's routes answer in its shape
    install_error_handlers(app, shapes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.api.max_body_bytes, shapes=shapes)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _route(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _route(request, "/v1/completions", CompletionRequest)

    install_responses_routes(app)
    install_messages_routes(app)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state = router_state(request)
        identify(config.api, request)
        for r in state.candidates(set()):
            with contextlib.suppress(httpx.HTTPError):
                resp = await state.client.get(
                    f"{r.spec.url}/v1/models", headers=forward_headers(dict(request.headers))
                )
                return Response(resp.content, resp.status_code, media_type="application/json")
        raise ApiError(503, "No replica is available", code="no_replica")

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        state = router_state(request)
        up = sum(r.healthy for r in state.replicas)
        status = 200 if up else 503
        return JSONResponse(
            {"status": "ok" if up else "no replica", "healthy_replicas": up}, status
        )

    @app.get("/v1/router/stats")
    async def stats(request: Request) -> JSONResponse:
        state = router_state(request)
        identify(config.api, request)
        return JSONResponse(state.stats())

    return app


async def _route(request: Request, path: str, schema: type) -> Response:
    state = router_state(request)
    caller = identify(state.config.api, request)
    body = await request.body()
    req = parse_body(body, schema)  # the replicas validate again; bad input stops here as a 4xx
    prompt = await asyncio.to_thread(request_prompt_ids, state.tokenizer, req)
    headers = forward_headers(dict(request.headers))
    key = affinity_key(caller, getattr(req, "prompt_cache_key", None))
    return await forward(state, Outbound("POST", path, body, headers, key, prompt))
