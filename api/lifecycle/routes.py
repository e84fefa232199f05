"""The readiness probe and the operator's drain: GET /ready (200 serving, 503 not yet or
draining), GET/POST/DELETE /admin/drain (admin key: status, begin, serve again). Liveness stays
/health."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api.auth import require_admin
from api.config import ApiConfig
from api.errors import ApiError
from api.lifecycle.drain import Drain

router = APIRouter()


def drain_of(request: Request) -> Drain:
    return request.app.state.drain


def _admin(request: Request) -> None:
    config: ApiConfig = request.app.state.api_config
    require_admin(config, request)


@router.get("/ready")
async def ready(request: Request) -> JSONResponse:
    drain = drain_of(request)
    state = getattr(request.app.state, "server", None)
    if state is None or not state.engine.is_running:
        return JSONResponse({"status": "not ready"}, 503)
    if drain.draining:
        return JSONResponse({"status": "draining", **drain.status()}, 503)
    return JSONResponse({"status": "ready"})


@router.get("/admin/drain")
async def drain_status(request: Request) -> dict[str, Any]:
    _admin(request)
    return drain_of(request).status()


@router.post("/admin/drain")
async def begin_drain(request: Request) -> dict[str, Any]:
    """Stops taking requests; the process keeps running (SIGTERM is what exits)."""
    _admin(request)
    drain = drain_of(request)
    drain.begin(exit_when_done=False)
    return drain.status()


@router.delete("/admin/drain")
async def cancel_drain(request: Request) -> dict[str, Any]:
    _admin(request)
    drain = drain_of(request)
    if not drain.cancel():
        raise ApiError(409, "The server is shutting down: its drain cannot be cancelled")
    return drain.status()
