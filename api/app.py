"""The FastAPI app factory. The engine is created in the lifespan (never at import)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from api.anthropic import routes as anthropic_routes
from api.anthropic.errors import error_body as anthropic_error_body
from api.body_limit import BodyLimitMiddleware
from api.cache import routes as cache_routes
from api.chat_template import ChatTemplates
from api.config import ApiConfig
from api.docs import docs_router
from api.errors import install_error_handlers
from api.lifecycle import routes as lifecycle_routes
from api.lifecycle.drain import Drain, DrainMiddleware
from api.observability import history_routes
from api.observability.dashboard import routes as dashboard_routes
from api.observability.metrics import ApiMetrics
from api.observability.prompt_cache_keys import PromptCacheKeys
from api.observability.stats_history import StatsHistory
from api.openai import routes as openai_routes
from api.openai import tokenize_routes
from api.openai.responses import routes as responses_routes
from api.openai.responses.store_factory import response_store_for
from api.openapi_bodies import install_request_schemas
from api.serving.pin_leases import PinLeases, sweep_forever
from api.state import ServerState, state_of
from engine.config import EngineConfig

if TYPE_CHECKING:
    from engine.async_engine import AsyncEngine

log = logging.getLogger("radixcache.api")


def _start_engine(config: EngineConfig, api_config: ApiConfig) -> AsyncEngine:
    from engine.async_engine import AsyncEngine

    engine = AsyncEngine(config, max_in_flight=api_config.max_queue)
    engine.start()
    return engine


async def _sample_forever(state: ServerState) -> None:
    while True:
        await asyncio.sleep(state.config.stats_interval_s)
        try:
            await asyncio.to_thread(state.sample)
        except Exception:  # a failing stats read must not take the server down
            log.exception("sampling cache counters failed")


def create_app(
    engine_config: EngineConfig,
    api_config: ApiConfig | None = None,
    *,
    on_ready: Callable[[ServerState], None] | None = None,
) -> FastAPI:
    api_config = api_config or ApiConfig()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = await asyncio.to_thread(_start_engine, engine_config, api_config)
        redis_url = engine_config.tiers.redis_url if engine_config.tiers else None
        responses = await asyncio.to_thread(response_store_for, api_config, redis_url)
        model_name = api_config.served_model_name or engine.model_name
        metrics = ApiMetrics(api_config.metrics_names, model_name)
        leases = PinLeases(engine.admin)
        state = ServerState(
            engine=engine,
            config=api_config,
            metrics=metrics,
            history=StatsHistory(api_config.stats_history_s, api_config.stats_interval_s),
            flops_per_token=2.0 * engine.num_parameters,
            templates=ChatTemplates.from_folder(Path(engine_config.model)),
            prompt_cache_keys=PromptCacheKeys(api_config.tracked_prompt_cache_keys),
            responses=responses,
            pin_leases=leases,
        )
        metrics.watch_engine(state.counters, state.tokens_per_s)
        metrics.watch_prompt_cache_keys(state.prompt_cache_keys)
        publisher = engine.kv_events
        if publisher is not None:
            metrics.watch_kv_events(lambda: publisher.stats)
        await asyncio.to_thread(state.sample)
        app.state.server = state
        sampler = asyncio.create_task(_sample_forever(state))
        sweeper = asyncio.create_task(sweep_forever(leases))
        if on_ready is not None:
            on_ready(state)
        try:
            yield
        finally:
            for task in (sampler, sweeper):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            app.state.server = None
            await asyncio.to_thread(leases.release_all)  # pins never outlive the server
            await asyncio.to_thread(engine.shutdown)
            await asyncio.to_thread(responses.close)

    # /docs is served offline by api/docs.py; ReDoc (CDN only) is off
    app = FastAPI(
        title="radixcache", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.server = None
    app.state.api_config = api_config
    app.state.drain = Drain(api_config.drain_timeout_s)
    shapes = {"/v1/messages": anthropic_error_body}  # Anthropic's routes answer in its shape
    install_error_handlers(app, shapes)
    app.add_middleware(BodyLimitMiddleware, max_bytes=api_config.max_body_bytes, shapes=shapes)
    app.add_middleware(DrainMiddleware, drain=app.state.drain, shapes=shapes)  # refuses first
    app.include_router(openai_routes.router)
    app.include_router(lifecycle_routes.router)
    app.include_router(responses_routes.router)
    app.include_router(anthropic_routes.router)
    app.include_router(history_routes.router)
    app.include_router(cache_routes.router)
    app.include_router(tokenize_routes.router)
    app.include_router(dashboard_routes.router)
    app.include_router(docs_router(app.openapi_url or "/openapi.json", app.title))
    install_request_schemas(app)

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        state = state_of(request)
        if not state.engine.is_running:
            return JSONResponse({"status": "engine stopped", "model": state.model_name}, 503)
        return JSONResponse({"status": "ok", "model": state.model_name})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        state = state_of(request)
        body = await asyncio.to_thread(state.metrics.render)
        return Response(body, media_type="text/plain; version=0.0.4")

    return app
