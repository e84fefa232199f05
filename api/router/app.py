"""The router's FastAPI app: the OpenAI routes proxied to the chosen replica, /health, /v1/models
and /v1/router/stats. Replicas, subscribers and the HTTP client live in the lifespan."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from api.auth import Caller, identify
from api.body_limit import BodyLimitMiddleware
from api.errors import ApiError, install_error_handlers, parse_body
from api.openai.protocol import ChatCompletionRequest, CompletionRequest
from api.router.affinity import AffinityKey, KeyAffinity
from api.router.config import RouterConfig
from api.router.policy import Router
from api.router.proxy import (
    Opened,
    UpstreamFailed,
    Usage,
    error_event,
    forward_headers,
    open_upstream,
)
from api.router.replicas import Replica, build_replicas
from api.router.state import RouterState, check_health, health_forever
from api.router.tokenize import PromptTokenizer

REPLICA_HEADER = "x-radixcache-replica"  # which replica answered (r0, r1, ... in --replica order)
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
            KeyAffinity(config.affinity_keys),
        )
        for r in replicas:
            if r.subscriber is not None:
                r.subscriber.start()
        await check_health(state)
        app.state.router = state
        health = asyncio.create_task(health_forever(state))
        try:
            yield
        finally:
            health.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await health
            app.state.router = None
            await client.aclose()
            for r in replicas:
                if r.subscriber is not None:
                    await asyncio.to_thread(r.subscriber.close)

    app = FastAPI(title="radixcache router", version="0.1.0", lifespan=lifespan)
    app.state.router = None
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.api.max_body_bytes)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await _route(request, "/v1/chat/completions", ChatCompletionRequest)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _route(request, "/v1/completions", CompletionRequest)

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state = _state(request)
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
        state = _state(request)
        up = sum(r.healthy for r in state.replicas)
        status = 200 if up else 503
        return JSONResponse(
            {"status": "ok" if up else "no replica", "healthy_replicas": up}, status
        )

    @app.get("/v1/router/stats")
    async def stats(request: Request) -> JSONResponse:
        state = _state(request)
        identify(config.api, request)
        return JSONResponse(state.stats())

    return app


def _state(request: Request) -> RouterState:
    state = getattr(request.app.state, "router", None)
    if state is None:
        raise ApiError(503, "The router is not ready yet", code="not_ready")
    return state


async def _route(request: Request, path: str, schema: type) -> Response:
    state = _state(request)
    caller = identify(state.config.api, request)
    body = await request.body()
    req = parse_body(body, schema)  # the replicas validate again; bad input stops here as a 4xx
    key = _affinity_key(caller, req)
    prompt = await asyncio.to_thread(_prompt_ids, state, req)
    tokens, cpu_us = prompt.ids, prompt.cpu_us
    headers = forward_headers(dict(request.headers))
    tried: set[str] = set()
    route_us = 0.0
    for _ in range(state.config.max_attempts):
        candidates = state.candidates(tried)
        if not candidates:
            break
        t0, c0 = time.perf_counter(), time.thread_time()
        decision = state.router.choose(candidates, tokens, _home(state, key, candidates))
        r = decision.replica
        tried.add(r.name)
        r.load += 1
        r.sent(tokens)  # before the replica answers: a request for the same prefix follows it
        if key is not None:
            state.affinity.learn(key, r.name)  # likewise: the key's next request follows it
        route_us += (time.perf_counter() - t0) * 1e6
        cpu_us += (time.thread_time() - c0) * 1e6
        if prompt.tail:
            state.spawn(_index_tail(state, r, prompt))
        try:
            opened = await open_upstream(state.client, r.spec.url + path, body, headers)
        except UpstreamFailed:
            r.load -= 1
            r.failures += 1
            state.take_out(r)  # the health check puts it back when it answers again
            continue
        state.overhead.add(prompt.wall_us, route_us, cpu_us)
        r.requests += 1
        r.decisions[decision.reason] += 1
        state.decisions[decision.reason] += 1
        r.predicted_cached_tokens += decision.predicted_tokens
        if getattr(req, "stream", False) and opened.response.status_code == 200:
            return StreamingResponse(
                _relay(r, opened), media_type="text/event-stream", headers={REPLICA_HEADER: r.name}
            )
        return await _whole(r, opened)
    state.unrouted += 1
    raise ApiError(503, "No replica could take the request", code="no_replica")


def _affinity_key(caller: Caller, req: Any) -> AffinityKey | None:
    """The request's prompt_cache_key within its caller's tenant (None: it has none)."""
    key = getattr(req, "prompt_cache_key", None)
    return None if key is None else (caller.tenant or "", key)


def _home(state: RouterState, key: AffinityKey | None, candidates: list[Replica]) -> Replica | None:
    """Where the key went last, if that replica can take this request."""
    name = None if key is None else state.affinity.home(key)
    return next((r for r in candidates if r.name == name), None)


@dataclass(frozen=True)
class PromptIds:
    """What routing needs of a prompt: the ids to route on, the text still to tokenize once the
    request is on its way (PromptTokenizer.chat_for_routing; empty when `ids` is the whole
    prompt), the wall and CPU µs spent on them."""

    ids: array  # array("q"): packed once for every index the request meets
    tail: str
    wall_us: float
    cpu_us: float


def _prompt_ids(state: RouterState, req: Any) -> PromptIds:
    t0, c0 = time.perf_counter(), time.thread_time()
    tok = state.tokenizer
    tail = ""
    try:
        if isinstance(req, ChatCompletionRequest):
            ids, tail = tok.chat_for_routing(req.chat_prompt())
        else:
            prompts = req.prompts()
            first = prompts[0] if prompts else ""
            ids = array("q", tok.encode(first) if isinstance(first, str) else first)
    except Exception as exc:  # template errors are the request's fault
        raise ApiError(400, f"Cannot tokenize the prompt: {exc}", param="messages") from exc
    wall, cpu = (time.perf_counter() - t0) * 1e6, (time.thread_time() - c0) * 1e6
    return PromptIds(ids, tail, wall, cpu)


async def _index_tail(state: RouterState, r: Replica, prompt: PromptIds) -> None:
    """Tokenizes a routed prompt's tail and tells the replica's index the whole prompt."""
    t0 = time.perf_counter()
    tail = await asyncio.to_thread(state.tokenizer.segments.encode_array, prompt.tail)
    r.sent(prompt.ids + tail)
    state.overhead.add_deferred((time.perf_counter() - t0) * 1e6)


async def _whole(r: Replica, opened: Opened) -> Response:
    resp = opened.response
    try:
        body = opened.first + b"".join([chunk async for chunk in opened.chunks])
    except httpx.HTTPError as exc:
        r.failures += 1
        raise ApiError(
            502, f"The replica failed mid-response: {exc}", code="replica_failed"
        ) from exc
    finally:
        r.load -= 1
        await resp.aclose()
    _count_usage(r, body)
    media = resp.headers.get("content-type", "application/json")
    return Response(body, resp.status_code, media_type=media, headers={REPLICA_HEADER: r.name})


async def _relay(r: Replica, opened: Opened) -> AsyncIterator[bytes]:
    """Passes the replica's stream through chunk by chunk; a failure mid-way ends it with an
    error event (never a hang: the read timeout bounds a silent replica)."""
    usage = Usage()
    try:
        yield opened.first
        usage.scan(opened.first)
        async for chunk in opened.chunks:
            usage.scan(chunk)
            yield chunk
    except httpx.HTTPError as exc:
        r.failures += 1
        yield error_event(f"The replica failed mid-stream: {type(exc).__name__}")
    finally:
        r.load -= 1
        await opened.response.aclose()
        r.prompt_tokens += usage.prompt_tokens
        r.reported_cached_tokens += usage.cached_tokens


def _count_usage(r: Replica, body: bytes) -> None:
    usage = Usage()
    usage.scan(body)
    r.prompt_tokens += usage.prompt_tokens
    r.reported_cached_tokens += usage.cached_tokens
