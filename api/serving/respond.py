"""A request's answer: its events streamed, or every job waited for and one JSON body; either way
counted in the request metrics by how it ended."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from api.serving.job_streams import ClientDisconnected, RunningJobs, collect_final
from api.serving.sse import EventStream
from engine.outputs import RequestResult

if TYPE_CHECKING:
    from api.state import ServerState


async def respond(
    request: Request,
    state: ServerState,
    running: RunningJobs,
    events: AsyncIterator[str] | None,
    build: Callable[[list[RequestResult]], dict[str, Any]],
    settle: Callable[[list[RequestResult]], Awaitable[None]] | None = None,
) -> Response:
    """Streams `events`, or waits for every job and answers `build(results)` once `settle`
    (what the route does with finished jobs before answering, e.g. pin) is done."""
    requests = state.metrics.requests
    if events is not None:
        return EventStream(events, lambda: requests.labels(request.url.path, "stream").inc())
    try:
        finals = await collect_final(running, request)
    except ClientDisconnected:
        requests.labels(request.url.path, "disconnected").inc()
        return Response(status_code=499)
    if settle is not None:
        await settle(finals)
    requests.labels(request.url.path, "ok").inc()
    return JSONResponse(build(finals))
