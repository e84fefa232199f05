"""GET /v1/cache/stats/history: per-interval stats of the last `seconds` (at most the history the
server keeps), one point per `step_s` (a multiple of the sampling interval)."""

from __future__ import annotations

import math
import time
from typing import Any

from fastapi import APIRouter, Query, Request

from api.auth import identify
from api.errors import ApiError
from api.observability.history_report import history_points
from api.state import state_of

router = APIRouter(prefix="/v1/cache")

MAX_POINTS = 2000


@router.get("/stats/history")
async def stats_history(
    request: Request,
    seconds: float | None = Query(None, description="how far back; omitted: all that is kept"),
    step_s: float | None = Query(None, description="seconds per point; omitted: one interval"),
) -> dict[str, Any]:
    state = state_of(request)
    identify(state.config, request)
    keep_s, interval_s = state.config.stats_history_s, state.config.stats_interval_s
    seconds = keep_s if seconds is None else seconds
    if not 0 < seconds <= keep_s:
        raise ApiError(
            400, f"'seconds' must be in (0, {keep_s:g}]: the history kept", param="seconds"
        )
    now = time.time()
    first = state.history.start()
    covered = min(seconds, now - first.time) if first is not None else 0.0
    if step_s is None:  # one interval per point, or as many as MAX_POINTS allows
        step = interval_s * max(1, math.ceil(covered / interval_s / MAX_POINTS))
    else:
        step = step_s
    if not interval_s <= step <= seconds:
        raise ApiError(
            400, f"'step_s' must be in [{interval_s:g}, seconds={seconds:g}]", param="step_s"
        )
    if covered / step > MAX_POINTS:
        raise ApiError(400, f"At most {MAX_POINTS} points: raise 'step_s'", param="step_s")
    points = history_points(state.history.since(now - seconds), step)
    return {
        "object": "cache.history",
        "interval_s": interval_s,
        "keep_s": keep_s,
        "step_s": step,
        "seconds": seconds,
        "max_samples": state.history.max_samples,
        "samples_held": len(state.history),
        "points": points,
    }
