"""A scripted HTTP replica for the router tests (as ScriptedPeer scripts a KV-events publisher):
it speaks just enough of /v1/responses, /v1/messages and chat to show where the router sent
each request and with which headers. It keeps the responses it made (its own store: any other id
is a 404, as a replica with a store of its own answers), and streams its `response.created`
event in two chunks (the router must read the id across them). A body with `"die": true` gets
one event, then the connection drops."""

from __future__ import annotations

import itertools
import json
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from tests.api.router_peers import wait_until


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ScriptedReplica:
    name: str
    seen: list[Seen] = field(default_factory=list)
    ids: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self._n = itertools.count()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        config = uvicorn.Config(self._app(), log_level="warning", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, daemon=True
        )
        self._thread.start()
        wait_until(lambda: self._server.started, 30, f"scripted replica {self.name}")

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)

    def paths(self) -> list[str]:
        return [f"{s.method} {s.path}" for s in self.seen]

    def _app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/health")
        @app.get("/ready")
        async def health() -> dict:
            return {"status": "ok"}

        @app.api_route("/v1/{rest:path}", methods=["GET", "POST", "DELETE"])
        async def any_route(rest: str, request: Request) -> Any:
            raw = await request.body()
            body = json.loads(raw) if raw else {}
            self.seen.append(Seen(request.method, f"/v1/{rest}", dict(request.headers), body))
            if body.get("die"):  # one event, then the connection drops mid-stream
                return StreamingResponse(_dying(), media_type="text/event-stream")
            if rest == "responses" and request.method == "POST":
                return self._create(body)
            if rest.startswith("responses/"):
                return self._by_id(request.method, rest.split("/")[1])
            return {"object": "echo", "replica": self.name}

        return app

    def _create(self, body: dict) -> Any:
        previous = body.get("previous_response_id")
        if previous is not None and previous not in self.ids:
            return _not_found(previous, "previous_response_id")
        rid = f"resp_{self.name}_{next(self._n)}"
        self.ids.add(rid)
        response = {"id": rid, "object": "response", "status": "completed", "usage": USAGE}
        if not body.get("stream"):
            return response
        return StreamingResponse(_events(response), media_type="text/event-stream")

    def _by_id(self, method: str, rid: str) -> Any:
        if rid not in self.ids:
            return _not_found(rid, None)
        if method == "DELETE":
            self.ids.discard(rid)
            return {"id": rid, "object": "response.deleted", "deleted": True}
        return {"id": rid, "object": "response", "status": "completed"}


USAGE = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "output_tokens": 2}


def _not_found(rid: str, param: str | None) -> JSONResponse:
    error = {"message": f"Response with id '{rid}' not found.", "type": "invalid_request_error"}
    return JSONResponse({"error": {**error, "param": param, "code": None}}, 404)


async def _dying() -> AsyncIterator[bytes]:
    yield b'event: ping\ndata: {"type": "ping"}\n\n'
    raise RuntimeError("the replica dies mid-stream")


async def _events(response: dict) -> AsyncIterator[bytes]:
    created = {"type": "response.created", "sequence_number": 0, "response": response}
    first = f"event: response.created\ndata: {json.dumps(created)}\n\n".encode()
    yield first[:20]
    yield first[20:]
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "hi"}
    yield f"event: response.output_text.delta\ndata: {json.dumps(delta)}\n\n".encode()
    done = {"type": "response.completed", "sequence_number": 2, "response": response}
    yield f"event: response.completed\ndata: {json.dumps(done)}\n\n".encode()
