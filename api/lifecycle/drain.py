"""The drain: once begun, readiness fails, new requests get 503 with Retry-After, and the requests
already being served run to their end, for at most `timeout_s`. The middleware counts the requests
being served (a stream counts until its last byte is sent); probes, /metrics and the admin paths are
always answered and never counted, so an orchestrator can watch a draining replica."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from api.errors import ErrorShape, error_body_for, send_json

# answered while draining and not counted as work: probes, metrics, the admin and the dashboard
ALWAYS_ANSWERED = ("/health", "/ready", "/metrics", "/admin/", "/dashboard", "/v1/cache/stats")


@dataclass
class Drain:
    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    started_at: float | None = None  # None: serving
    exit_when_done: bool = False  # SIGTERM: the process exits once drained
    active: int = 0  # requests being served
    _deadline: float = field(default=math.inf, repr=False)

    @property
    def draining(self) -> bool:
        return self.started_at is not None

    def begin(self, exit_when_done: bool) -> None:
        """Starts the drain (a second call keeps the first deadline; exiting is never undone)."""
        self.exit_when_done = self.exit_when_done or exit_when_done
        if self.started_at is None:
            self.started_at = self.clock()
            self._deadline = self.started_at + self.timeout_s

    def cancel(self) -> bool:
        """Serves again (an operator's drain only: a drain that ends in exit cannot be undone)."""
        if self.exit_when_done:
            return False
        self.started_at, self._deadline = None, math.inf
        return True

    @property
    def done(self) -> bool:
        """Drained: nothing is being served any more, or the deadline passed."""
        return self.draining and (self.active == 0 or self.clock() >= self._deadline)

    def retry_after_s(self) -> int:
        """What a refused caller is told to wait: the drain's time left, at least a second."""
        left = self._deadline - self.clock() if self.draining else 0.0
        return max(1, math.ceil(min(left, self.timeout_s)))

    def status(self) -> dict[str, object]:
        return {
            "draining": self.draining,
            "exit_when_done": self.exit_when_done,
            "active_requests": self.active,
            "seconds_left": None if not self.draining else max(self._deadline - self.clock(), 0),
            "drained": self.done,
        }


def always_answered(path: str) -> bool:
    return any(path == p.rstrip("/") or path.startswith(p) for p in ALWAYS_ANSWERED)


class DrainMiddleware:
    """Counts the requests being served and refuses new ones while draining (in the error shape
    of the route's protocol: OpenAI's unless `shapes` names the path's prefix)."""

    def __init__(
        self, app: ASGIApp, drain: Drain, shapes: Mapping[str, ErrorShape] | None = None
    ) -> None:
        self.app = app
        self.drain = drain
        self.shapes = dict(shapes or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or always_answered(scope["path"]):
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            await self._refuse(send, scope["path"])
            return
        self.drain.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.active -= 1

    async def _refuse(self, send: Send, path: str) -> None:
        message = "The server is draining: retry on another replica"
        body = error_body_for(self.shapes, path, 503, message, code="draining")
        retry = [(b"retry-after", str(self.drain.retry_after_s()).encode())]
        await send_json(send, 503, body, retry)
