"""/dashboard (the page), /dashboard/assets/* (its script, style and plotly.js from the `plotly`
package: no CDN), /dashboard/data (what the page shows beyond the stats and history endpoints)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse

from api.auth import identify
from api.observability.dashboard.view import (
    device_hit_rate,
    hottest,
    owned_salts,
    prefix_row,
    sizing_advice,
    spill_estimate,
    tenant_rows,
)
from api.package_assets import PackageAssets
from api.state import state_of
from engine.kv.admin import HottestPrefixes

router = APIRouter(prefix="/dashboard")

OURS = PackageAssets(
    "api.observability.dashboard",
    "static",
    frozenset({"index.html", "dashboard.js", "dashboard.css"}),
)
PLOTLY = PackageAssets("plotly", "package_data", frozenset({"plotly.min.js"}))
WINDOW_S = 300.0


@router.get("", include_in_schema=False)
async def page() -> FileResponse:
    return OURS.response("index.html")


@router.get("/assets/{name}", include_in_schema=False)
async def asset(name: str) -> FileResponse:
    return PLOTLY.response(name) if name in PLOTLY.names else OURS.response(name)


@router.get("/data")
async def data(request: Request, limit: int = Query(20, ge=1, le=200)) -> dict[str, Any]:
    """Tenants' hit rates, the hottest prefixes and the sizing advice, as this caller may see
    them: a tenant key sees its own tenant only; the admin sees every tenant."""
    state = state_of(request)
    caller = identify(state.config, request)
    counters = await asyncio.to_thread(state.counters)
    total = counters.cache
    window, _ = state.cache_delta(total, WINDOW_S)
    engine = state.engine
    if caller.is_admin:
        infos = await asyncio.to_thread(engine.admin, HottestPrefixes(limit, None))
    elif caller.tenant is None and not state.config.auth_enabled:
        infos = []  # keyless callers on a network address: that namespace is everyone's prompts
    else:
        infos = []
        for salt in owned_salts(total, caller):
            infos += await asyncio.to_thread(engine.admin, HottestPrefixes(limit, salt))
    tok = engine.tokenizer
    curve, measured = counters.device.miss_ratio_curve, device_hit_rate(total)
    return {
        "caller": {"tenant": caller.tenant, "is_admin": caller.is_admin},
        "model": state.model_name,
        "tenants": tenant_rows(total, window, caller),
        "prefixes": [prefix_row(tok, i, caller) for i in hottest(infos, limit)],
        "sizing_advice": sizing_advice(curve, measured),
        "spill_estimate": spill_estimate(curve, counters.occupancy, measured),
    }
