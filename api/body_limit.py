"""ASGI middleware rejecting request bodies over a byte limit with 413 (checked while streaming),
in the error shape of the route's protocol (OpenAI's unless `shapes` names the path's prefix)."""

from __future__ import annotations

from collections.abc import Mapping

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import ErrorShape, error_body_for, send_json


class BodyTooLarge(Exception):
    pass


class BodyLimitMiddleware:
    def __init__(
        self, app: ASGIApp, max_bytes: int, shapes: Mapping[str, ErrorShape] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.shapes = dict(shapes or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._reject(send, scope.get("path", ""))
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, scope.get("path", ""))

    async def _reject(self, send: Send, path: str) -> None:
        message = f"Request body too large (limit {self.max_bytes} bytes)"
        await send_json(send, 413, error_body_for(self.shapes, path, 413, message))
