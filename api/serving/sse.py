"""Server-sent events: the response that streams them and the `data:` framing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from api.errors import ApiError, error_json


class EventStream(StreamingResponse):
    """An SSE response that runs `on_close` however it ends (done, error, client gone)."""

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        super().__init__(
            events,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._events.aclose()
            self._on_close()


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


def error_event(exc: Exception) -> str:
    """A failure after the stream started, as the last event but `[DONE]`."""
    if isinstance(exc, ApiError):
        return sse(error_json(exc.status, exc.message, exc.param, exc.code))
    return sse(error_json(500, f"Generation failed: {type(exc).__name__}: {exc}"))
