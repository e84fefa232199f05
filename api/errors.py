"""OpenAI-style JSON errors: {"error": {"message", "type", "param", "code"}}; never a bare 500."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("radixcache.api")

M = TypeVar("M", bound=BaseModel)

_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, param: str | None = None, code: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


def error_json(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict:
    err_type = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def error_response(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_json(status, message, param, code), status, headers=headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_field(part: object) -> bool:
    """A location part naming a field or an index, not a union member (`constrained-str`)."""
    text = str(part)
    return text != "body" and text not in _TYPE_TAGS and not any(c in text for c in "[-")


def _field_path(error: dict) -> str:
    return ".".join(str(p) for p in error.get("loc", ()) if _is_field(p))


def _describe(errors: list) -> tuple[str, str | None]:
    unknown = list(
        dict.fromkeys(_field_path(e) for e in errors if e.get("type") == "extra_forbidden")
    )
    if unknown:  # a field we would not honour: named, never silently dropped
        names = ", ".join(f"'{n}'" for n in unknown)
        return (
            f"Unrecognized request argument supplied: {names} (this server does not honour "
            "it; the request schema is at /openapi.json)",
            unknown[0],
        )
    first = errors[0]
    loc = [str(p) for p in first.get("loc", ()) if _is_field(p)]
    param = ".".join(loc) or None
    msg = first.get("msg", "invalid value")
    if first.get("type") == "missing":
        return f"Missing required parameter: '{param}'", param
    return (f"Invalid value for '{param}': {msg}" if param else msg), param


def parse_body(raw: bytes, model: type[M]) -> M:
    """Validate a JSON body into `model`; invalid JSON and schema errors become 400s."""
    if not raw.strip():
        raise ApiError(400, "Request body is empty: expected a JSON object", code="invalid_json")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"Invalid JSON in request body: {exc}", code="invalid_json") from exc
    if not isinstance(data, dict):
        raise ApiError(400, "Request body must be a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        message, param = _describe(exc.errors())
        raise ApiError(400, message, param=param, code="invalid_value") from exc


ErrorShape = Callable[[int, str], dict]  # (status, message) -> another protocol's error body


def error_body_for(
    shapes: Mapping[str, ErrorShape], path: str, status: int, message: str, code: str | None = None
) -> dict:
    """The error body in the protocol served at `path`: the shape of the first prefix of
    `shapes` it starts with, else OpenAI's."""
    shape = next((f for prefix, f in shapes.items() if path.startswith(prefix)), None)
    return shape(status, message) if shape is not None else error_json(status, message, code=code)


async def send_json(
    send: Callable[[dict], Awaitable[None]],
    status: int,
    body: dict,
    headers: list[tuple[bytes, bytes]] | None = None,
) -> None:
    """A whole JSON response straight on the ASGI channel (for middleware answering itself)."""
    data = json.dumps(body).encode()
    head = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": head + (headers or [])})
    await send({"type": "http.response.body", "body": data})


def install_error_handlers(app: FastAPI, shapes: Mapping[str, ErrorShape] | None = None) -> None:
    """`shapes`: path prefix -> the error body of the protocol served there, for what no route
    answers (an unknown path or method under it); OpenAI's shape elsewhere."""
    shaped = dict(shapes or {})

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        return error_response(exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _describe(list(exc.errors()))
        return error_response(400, message, param, "invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        path = request.url.path
        if any(path.startswith(prefix) for prefix in shaped):  # (else OpenAI's, 401's header too)
            body = error_body_for(shaped, path, exc.status_code, str(exc.detail))
            return JSONResponse(body, exc.status_code)
        return error_response(exc.status_code, str(exc.detail))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return error_response(500, f"Internal error: {type(exc).__name__}", code="internal_error")
